"""bob plot: what the figures hold, read from the Figure objects and the PNG files."""

from __future__ import annotations

import math
import pickle
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
from matplotlib import image as mpimg

from bob.cli.main import main
from bob.host import plot as plot_module
from bob.host.plot import (
    OPTIMUM_LABEL,
    ROWS_READ_BYTES,
    TOP_SYMBOLS,
    TRAIN_LABEL,
    VALIDATION_LABEL,
    choose_symbols,
    loss_figure,
    png_bytes,
    symbol_counts,
    symbol_label,
    transition_probabilities,
    transitions_figure,
)
from bob.program.bob import Hyper
from bob.records.checkpoint import Checkpoint, Segment
from bob.records.counting import PairCounts
from conftest import listing

HISTORY = ((0, 5.545), (100, 3.1), (200, 2.6), (300, 2.5))


def legend_texts(axes) -> list[str]:
    return [text.get_text() for text in axes.get_legend().get_texts()]


def tick_texts(axis) -> list[str]:
    return [label.get_text() for label in axis.get_ticklabels()]


def test_loss_figure_starts_at_the_first_invocation_on_a_log_scale():
    figure = loss_figure(HISTORY, optimum=2.45)
    loss_axes, excess_axes = figure.axes
    assert figure.get_suptitle() == "Bob: loss per invocation"
    assert loss_axes.get_xlabel() == "update"
    assert loss_axes.get_ylabel() == "loss (nats per transition, log scale)"
    assert loss_axes.get_yscale() == "log"
    assert legend_texts(loss_axes) == [TRAIN_LABEL, OPTIMUM_LABEL]
    train_line = loss_axes.get_lines()[0]
    # The loss before any update (5.545) is left off: the curve starts at update 100.
    assert list(train_line.get_xdata()) == [100, 200, 300]
    assert list(train_line.get_ydata()) == [3.1, 2.6, 2.5]
    optimum_line = loss_axes.get_lines()[1]
    assert set(optimum_line.get_ydata()) == {2.45}
    # Plain numbers from one at or below the optimum to one at or above the first loss,
    # the axis between them, no minor-tick labels.
    ticks = [float(text) for text in tick_texts(loss_axes.yaxis)]
    assert len(ticks) >= 3 and min(ticks) <= 2.45 and max(ticks) >= 3.1, ticks
    assert loss_axes.get_ylim() == (min(ticks), max(ticks))
    assert loss_axes.yaxis.get_minorticklocs().size == 0
    # The excess panel keeps update 0.
    assert excess_axes.get_yscale() == "log"
    assert excess_axes.get_title() == "excess over the optimum"
    assert excess_axes.get_lines()[0].get_ydata() == pytest.approx(
        [5.545 - 2.45, 3.1 - 2.45, 2.6 - 2.45, 2.5 - 2.45])


def test_a_loss_curve_within_a_narrow_range_still_has_labelled_ticks():
    figure = loss_figure(((0, 5.5), (100, 2.4747), (200, 2.4647), (1000, 2.4562)), 2.4525)
    ticks = [float(text) for text in tick_texts(figure.axes[0].yaxis)]
    assert len(ticks) >= 3 and len(set(tick_texts(figure.axes[0].yaxis))) == len(ticks)
    # Ticks around the optimum: one at or below it, the others above it, to the first loss.
    assert min(ticks) <= 2.4525 < sorted(ticks)[1] and max(ticks) >= 2.4747, ticks
    assert max(ticks) - min(ticks) < 0.05  # not stretched to 0 or to a decade


def test_loss_figure_draws_the_validation_points_and_changes():
    validation = ((0, 5.5), (100, 3.3), (300, 2.7))
    figure = loss_figure(HISTORY, optimum=2.45, validation=validation, changes=[200])
    loss_axes, excess_axes = figure.axes
    assert VALIDATION_LABEL in legend_texts(loss_axes)
    curve = next(line for line in loss_axes.get_lines() if line.get_label() == VALIDATION_LABEL)
    assert list(curve.get_xdata()) == [100, 300] and list(curve.get_ydata()) == [3.3, 2.7]
    assert curve.get_marker() == "s"
    assert "data or hyperparameters changed" in legend_texts(loss_axes)
    # The excess is over the training data's optimum: no validation curve there.
    assert VALIDATION_LABEL not in legend_texts(excess_axes)


def test_loss_figure_without_an_optimum_has_one_panel():
    figure = loss_figure(HISTORY)
    assert len(figure.axes) == 1 and legend_texts(figure.axes[0]) == [TRAIN_LABEL]


def test_a_history_of_one_point_is_drawn():
    figure = loss_figure(((0, 5.545),), optimum=2.45)
    assert list(figure.axes[0].get_lines()[0].get_ydata()) == [5.545]


def test_a_loss_at_the_optimum_is_left_off_the_log_scale():
    figure = loss_figure(((0, 1.0), (10, 0.0)), optimum=0.0)
    excess = figure.axes[1].get_lines()[0].get_ydata()
    assert excess[0] == 1.0 and math.isnan(excess[1])


def trained_on(text: bytes, vocab: int = 256) -> np.ndarray:
    """A table as training leaves it: rows of the previous symbols seen moved (towards the
    symbols that followed), every other row still constant."""
    table = np.zeros((vocab, vocab), np.float32)
    for previous, following in zip(text[:-1], text[1:], strict=True):
        table[previous] -= 0.01
        table[previous, following] += 1.0
    return table


def test_the_byte_map_shows_only_the_bytes_the_data_uses_with_printable_labels():
    text = "the cat\tsat\non a mat ÿ".encode("latin-1") + bytes([0x9F, 0x21])
    table = trained_on(text)
    figure = transitions_figure(table)
    axes, colour_bar_axes = figure.axes
    assert axes.get_xlabel() == "next byte" and axes.get_ylabel() == "previous byte"
    used = sorted(set(text[:-1]))  # the last byte is never a previous one
    assert axes.get_title() == f"Learned transitions: the {len(used)} bytes the data uses (V=256)"
    labels = tick_texts(axes.xaxis)
    assert labels == tick_texts(axes.yaxis) == [symbol_label(b, 256) for b in used]
    for wanted in ("'\\t'", "'\\n'", "' '", "'a'", "0x9f", "0xff"):
        assert wanted in labels, (wanted, labels)
    shown = np.asarray(axes.get_images()[0].get_array())
    assert shown.shape == (len(used), len(used))
    assert np.array_equal(shown, transition_probabilities(table[used])[:, used])
    assert colour_bar_axes.get_ylabel() == "P(next | previous), square-root colour scale"


def test_symbol_labels():
    assert [symbol_label(b, 256) for b in b"a \n\t\r'"] == [
        "'a'", "' '", "'\\n'", "'\\t'", "'\\r'", '"\'"']
    assert [symbol_label(b, 256) for b in (0, 0x7F, 0x9F, 0xE2)] == [
        "0x00", "0x7f", "0x9f", "0xe2"]
    assert symbol_label(464, 50257) == "464"


class CountingRows:
    """The rows of a V x V table made on request (never the whole), counting what is read."""

    def __init__(self, vocab: int, frequent: list[int]):
        self.vocab, self.frequent = vocab, frequent
        self.largest_read = 0
        self.rows_read = 0

    def __call__(self, indices) -> np.ndarray:
        indices = list(indices)
        self.largest_read = max(self.largest_read, len(indices))
        self.rows_read += len(indices)
        rows = np.zeros((len(indices), self.vocab), np.float32)
        for i, row in enumerate(indices):
            if row % 3 == 0:  # a third of the rows trained, leaning to the frequent tokens
                rows[i, self.frequent] = 4.0 + np.arange(len(self.frequent))[::-1] / 16
                rows[i, row] += 0.5
        return rows


def test_at_large_v_the_map_shows_the_most_frequent_tokens_in_bounded_memory():
    vocab = 8192
    frequent = [int(t) for t in np.random.default_rng(5).choice(vocab // 3, 80,
                                                                 replace=False) * 3]
    rows = CountingRows(vocab, frequent)
    tracemalloc.start()
    figure = transitions_figure(rows, vocab)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 200e6  # a V x V float32 table alone is 268 MB; float64 537 MB
    assert rows.largest_read * vocab * 4 <= ROWS_READ_BYTES
    assert rows.rows_read == vocab + TOP_SYMBOLS  # one pass, then the rows drawn
    axes = figure.axes[0]
    used = len(range(0, vocab, 3))
    assert axes.get_title() == (f"Learned transitions: the {TOP_SYMBOLS} most frequent of "
                                f"the {used} tokens the data uses, by the model's estimate "
                                f"(V={vocab})")
    assert axes.get_xlabel() == "next token"
    # The model's estimate ranks the frequent tokens first, in their order of weight.
    assert tick_texts(axes.xaxis) == [str(t) for t in frequent[:TOP_SYMBOLS]]
    assert np.asarray(axes.get_images()[0].get_array()).shape == (TOP_SYMBOLS, TOP_SYMBOLS)


def test_with_counts_the_top_symbols_are_the_counted_ones():
    vocab = 1024
    rng = np.random.default_rng(2)
    tokens = rng.zipf(1.3, 20_000) % vocab
    dense = np.zeros((vocab, vocab), np.uint64)
    np.add.at(dense, (tokens[:-1], tokens[1:]), 1)
    frequency = symbol_counts(PairCounts.from_dense(dense))
    assert np.array_equal(frequency, dense.sum(axis=0) + dense.sum(axis=1))
    selection = choose_symbols(CountingRows(vocab, []), vocab, frequency)
    order = np.argsort(-frequency, kind="stable")[:TOP_SYMBOLS]
    assert selection.symbols == tuple(int(t) for t in order)
    assert selection.ranked_by == "counts" and selection.used == int((frequency > 0).sum())


def test_png_reads_back(tmp_path):
    path = tmp_path / "t.png"
    path.write_bytes(png_bytes(transitions_figure(trained_on(b"abcabd"))))
    pixels = mpimg.imread(path)
    assert pixels.shape == (640, 800, 4)
    assert len(np.unique(pixels.reshape(-1, 4), axis=0)) > 10  # drawn, not blank


def test_plot_command_writes_both_images(tmp_path, capsys):
    path = tmp_path / "bob.safetensors"
    digest = "ab" * 32
    zeros = Checkpoint.zeros(256, Hyper(), "corpus", digest)
    segments = (Segment(0, digest, Hyper()), Segment(200, digest, Hyper(lr=0.2)))
    state = Checkpoint(zeros.parameters, zeros.first_moment, zeros.second_moment, 300,
                       Hyper(lr=0.2), "corpus", digest, HISTORY, 2.45, segments)
    state.save(path)
    out = tmp_path / "plots"
    assert main(["plot", "-c", str(path), "--out", str(out)]) == 0
    assert capsys.readouterr().out.split() == [str(out / "loss.png"),
                                               str(out / "transitions.png")]
    loss = mpimg.imread(out / "loss.png")
    assert loss.shape == (480, 1280, 4)  # two panels: loss and excess
    # No row trained: the first 64 bytes, 0.2 inches a byte and room for the labels,
    # beside the colour bar.
    assert mpimg.imread(out / "transitions.png").shape == (1463, 1623, 4)


def test_plot_command_draws_a_trained_checkpoint_from_its_rows(tmp_path, capsys, monkeypatch):
    text = tmp_path / "a.txt"
    text.write_bytes(b"the cat sat on the mat.\n" * 20)
    path = tmp_path / "bob.safetensors"
    assert main(["train", "--backend", "cpu", "--text", str(text), "--steps", "20", "-N", "10",
                 "-c", str(path)]) == 0
    drawn = []
    original = plot_module.transitions_figure

    def keep(*args, **kwargs):
        drawn.append(original(*args, **kwargs))
        return drawn[-1]

    monkeypatch.setattr(plot_module, "transitions_figure", keep)
    monkeypatch.setattr(Checkpoint, "load", None)  # the rows are read, never the tables
    out = tmp_path / "plots"
    capsys.readouterr()
    assert main(["plot", "-c", str(path), "--out", str(out)]) == 0
    axes = drawn[0].axes[0]
    used = sorted(set(b"the cat sat on the mat.\n"))
    assert tick_texts(axes.xaxis) == [symbol_label(b, 256) for b in used]
    assert sorted(p.name for p in out.iterdir()) == ["loss.png", "transitions.png"]


def test_plot_refuses_counts_of_another_vocabulary(tmp_path, capsys):
    text = tmp_path / "a.txt"
    text.write_bytes(b"the cat sat on the mat.\n" * 20)
    path = tmp_path / "bob.safetensors"
    assert main(["train", "--backend", "cpu", "--text", str(text), "--steps", "2",
                 "-c", str(path)]) == 0
    tokens = tmp_path / "t.bin"
    np.arange(100, dtype=np.uint16).tofile(tokens)
    counts = tmp_path / "t.counts"
    assert main(["count", "--tokens", str(tokens), "--vocab", "512", "-o", str(counts)]) == 0
    capsys.readouterr()
    out = tmp_path / "plots"
    assert main(["plot", "-c", str(path), "--out", str(out), "--counts", str(counts)]) == 2
    assert f"{counts}: counts of V=512, the checkpoint has V=256" in capsys.readouterr().err
    assert not out.exists()


# -- readable, named, around the optimum; --tokenizer; --overwrite ----------------------------
def test_the_heat_maps_labels_are_readable_at_any_count():
    """At the PNG's 100 dpi a tick label is at least 13 px tall and each cell holds one
    (they were 6 pt, about 8 px and a 5 px x-height, in cells narrower than that)."""
    for used in (17, 64, 128, 200):
        text = bytes(range(32, 32 + used)) * 2 if used <= 95 else bytes(range(256))[:used] * 2
        figure = transitions_figure(trained_on(text))
        axes = figure.axes[0]
        png_bytes(figure)  # lay it out as saved
        size_px = max(label.get_fontsize() for label in axes.get_yticklabels()) * 100 / 72
        assert size_px >= 13, (used, size_px)
        height_px = axes.get_window_extent().height
        shown = axes.get_images()[0].get_array().shape[0]
        labelled = len(axes.get_yticklabels())
        assert height_px / labelled >= size_px, (used, height_px, labelled)
        assert shown >= labelled


def test_the_colour_scale_says_it_is_not_linear():
    figure = transitions_figure(trained_on(b"abcabd"))
    bar = figure.axes[1]
    assert bar.get_ylabel().endswith(", square-root colour scale")
    assert [float(t) for t in bar.get_yticks()] == [0.0, 0.01, 0.05, 0.1, 0.25, 0.5, 0.75, 1.0]


def test_a_run_of_one_invocation_draws_a_line():
    figure = loss_figure(((0, 5.545), (100, 2.47)), optimum=2.45)
    line = figure.axes[0].get_lines()[0]
    assert list(line.get_xdata()) == [0, 100] and list(line.get_ydata()) == [5.545, 2.47]
    ticks = [float(text) for text in tick_texts(figure.axes[0].yaxis)]
    assert min(ticks) <= 2.45 and max(ticks) >= 5.545


def test_validation_below_the_optimum_stays_on_the_axis():
    """Held-out data may have a loss below the training data's optimum."""
    figure = loss_figure(((0, 5.5), (100, 1.25), (200, 1.236)), optimum=1.2185,
                         validation=((0, 5.5), (100, 1.232), (200, 1.2146)))
    low, high = figure.axes[0].get_ylim()
    assert low <= 1.2146 and high >= 1.25


def char_level_model(directory: Path) -> tuple[Path, Path]:
    """A model of characters with nanoGPT's meta.pkl."""
    text = "first citizen:\nbefore we proceed any further, hear me speak.\n" * 20
    chars = sorted(set(text))
    stoi = {ch: i for i, ch in enumerate(chars)}
    np.array([stoi[c] for c in text], np.uint16).tofile(directory / "train.bin")
    with open(directory / "meta.pkl", "wb") as file:
        pickle.dump({"vocab_size": len(chars), "itos": dict(enumerate(chars)), "stoi": stoi},
                    file)
    model = directory / "chars.safetensors"
    assert main(["train", "--backend", "cpu", "--tokens", str(directory / "train.bin"),
                 "--tokenizer", str(directory / "meta.pkl"), "--steps", "20", "-c",
                 str(model)]) == 0
    return model, directory / "meta.pkl"


def test_plot_tokenizer_labels_the_map_with_the_tokens_text(tmp_path, capsys, monkeypatch):
    model, meta = char_level_model(tmp_path)
    drawn = []
    original = plot_module.transitions_figure

    def keep(*args, **kwargs):
        drawn.append(original(*args, **kwargs))
        return drawn[-1]

    monkeypatch.setattr(plot_module, "transitions_figure", keep)
    assert main(["plot", "-c", str(model), "--tokenizer", str(meta), "--out",
                 str(tmp_path / "with")]) == 0
    labels = tick_texts(drawn[-1].axes[0].xaxis)
    assert {"'f'", "'\\n'", "' '", "','"} <= set(labels), labels
    assert main(["plot", "-c", str(model), "--out", str(tmp_path / "without")]) == 0
    assert all(label.isdigit() for label in tick_texts(drawn[-1].axes[0].xaxis))
    assert symbol_label(7, 300, lambda s: "a long token text") == "'a long t…"


def test_plot_refuses_a_tokenizer_of_another_v(tmp_path, capsys):
    model, _ = char_level_model(tmp_path)
    meta = tmp_path / "other.pkl"
    with open(meta, "wb") as file:
        pickle.dump({"vocab_size": 3, "itos": {0: "a", 1: "b", 2: "c"},
                     "stoi": {"a": 0, "b": 1, "c": 2}}, file)
    capsys.readouterr()
    before = listing(tmp_path)
    assert main(["plot", "-c", str(model), "--tokenizer", str(meta), "--out",
                 str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "V=3" in err
    assert listing(tmp_path) == before


def test_plot_refuses_to_replace_pngs_without_overwrite(tmp_path, capsys):
    path = tmp_path / "bob.safetensors"
    zeros = Checkpoint.zeros(256, Hyper(), "corpus", "ab" * 32)
    Checkpoint(zeros.parameters, zeros.first_moment, zeros.second_moment, 300, Hyper(),
               "corpus", "ab" * 32, HISTORY, 2.45).save(path)
    out = tmp_path / "plots"
    assert main(["plot", "-c", str(path), "--out", str(out)]) == 0
    first = {name: (out / name).read_bytes() for name in ("loss.png", "transitions.png")}
    (out / "loss.png").write_bytes(b"the user's own picture")
    capsys.readouterr()
    assert main(["plot", "-c", str(path), "--out", str(out)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == f"bob: {out / 'loss.png'}: exists; pass --overwrite to replace it\n"
    assert (out / "loss.png").read_bytes() == b"the user's own picture"
    assert (out / "transitions.png").read_bytes() == first["transitions.png"]
    assert main(["plot", "-c", str(path), "--out", str(out), "--overwrite"]) == 0
    assert (out / "loss.png").read_bytes() == first["loss.png"]
