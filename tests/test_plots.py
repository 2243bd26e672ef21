"""bob plot: what the figures hold, read from the Figure objects and the PNG files."""

from __future__ import annotations

import math

import numpy as np
import pytest
from matplotlib import image as mpimg

from bob.cli.main import main
from bob.host.plot import (
    OPTIMUM_LABEL,
    TRAIN_LABEL,
    VALIDATION_LABEL,
    loss_figure,
    png_bytes,
    transition_probabilities,
    transitions_figure,
)
from bob.program.bob import Hyper
from bob.records.checkpoint import Checkpoint, Segment

HISTORY = ((0, 5.545), (100, 3.1), (200, 2.6), (300, 2.5))


def legend_texts(axes) -> list[str]:
    return [text.get_text() for text in axes.get_legend().get_texts()]


def test_loss_figure_shows_loss_and_excess_on_a_log_scale():
    figure = loss_figure(HISTORY, optimum=2.45)
    loss_axes, excess_axes = figure.axes
    assert figure.get_suptitle() == "Bob: loss per invocation"
    assert loss_axes.get_xlabel() == "update" and "nats" in loss_axes.get_ylabel()
    assert legend_texts(loss_axes) == [TRAIN_LABEL, OPTIMUM_LABEL]
    train_line = loss_axes.get_lines()[0]
    assert list(train_line.get_xdata()) == [0, 100, 200, 300]
    assert list(train_line.get_ydata()) == [5.545, 3.1, 2.6, 2.5]
    optimum_line = loss_axes.get_lines()[1]
    assert set(optimum_line.get_ydata()) == {2.45}
    assert excess_axes.get_yscale() == "log"
    assert excess_axes.get_title() == "excess over the optimum"
    assert excess_axes.get_lines()[0].get_ydata() == pytest.approx(
        [5.545 - 2.45, 3.1 - 2.45, 2.6 - 2.45, 2.5 - 2.45])


def test_loss_figure_draws_the_validation_curve_and_changes():
    validation = ((100, 3.3), (300, 2.7))
    figure = loss_figure(HISTORY, optimum=2.45, validation=validation, changes=[200])
    loss_axes, excess_axes = figure.axes
    assert VALIDATION_LABEL in legend_texts(loss_axes)
    assert VALIDATION_LABEL in legend_texts(excess_axes)
    curve = next(line for line in loss_axes.get_lines() if line.get_label() == VALIDATION_LABEL)
    assert list(curve.get_xdata()) == [100, 300] and list(curve.get_ydata()) == [3.3, 2.7]
    assert "data or hyperparameters changed" in legend_texts(loss_axes)


def test_loss_figure_without_an_optimum_has_one_panel():
    figure = loss_figure(HISTORY)
    assert len(figure.axes) == 1 and legend_texts(figure.axes[0]) == [TRAIN_LABEL]


def test_a_loss_at_the_optimum_is_left_off_the_log_scale():
    figure = loss_figure(((0, 1.0), (10, 0.0)), optimum=0.0)
    excess = figure.axes[1].get_lines()[0].get_ydata()
    assert excess[0] == 1.0 and math.isnan(excess[1])


def test_transitions_figure_is_a_labelled_heat_map():
    rng = np.random.default_rng(3)
    table = rng.standard_normal((16, 16)).astype(np.float32)
    figure = transitions_figure(table)
    axes, colour_bar_axes = figure.axes
    assert axes.get_xlabel() == "next byte" and axes.get_ylabel() == "previous byte"
    assert "V=16" in axes.get_title()
    shown = axes.get_images()[0].get_array()
    probabilities = transition_probabilities(table)
    assert np.array_equal(np.asarray(shown), probabilities)
    assert np.allclose(probabilities.sum(axis=1), 1.0)
    assert colour_bar_axes.get_ylabel() == "P(next | previous)"


def test_png_reads_back(tmp_path):
    path = tmp_path / "t.png"
    path.write_bytes(png_bytes(transitions_figure(np.zeros((8, 8), np.float32))))
    pixels = mpimg.imread(path)
    assert pixels.shape == (640, 720, 4)
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
    assert mpimg.imread(out / "transitions.png").shape == (640, 720, 4)
