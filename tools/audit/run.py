"""An adversarial audit of the `bob` command line on the cpu backend, re-runnable:

    PYTHONPATH=src python3 -m tools.audit.run            # everything (a few minutes)
    PYTHONPATH=src python3 -m tools.audit.run --quick    # a few cases of each class

It tries the hostile inputs and paths of each fault class (special files, hostile
metadata, huge, nested and unbounded values, a full disk and a file-size limit, outputs
that cannot be written, symlinks, usage errors, pickles of mixed types, JSON values that
are no strings where strings belong, empty paths, outputs that are inputs under another
name, extreme numeric options, address-space limits, stop signals at many moments,
fuzzed plans), each `bob` a process of its own in a directory of its own, and sorts what
happened:

- refused cleanly: exit 1 or 2 (or 130/143 after a signal) with one line on stderr
  starting "bob" (after a failure at run time or a signal, that line comes last, after
  any progress lines), nothing on stdout but what the command prints, no traceback, and
  the directory as it was (after a signal: at most the checkpoint the report names,
  loadable);
- read as a stream: a pipe or FIFO read as a text input, exit 0 (the documented rule);
- ran as documented: an extreme value the command takes (a temperature of 1e-45 is
  greedy), or a limit that left room, exit 0 with no warning or traceback on stderr and
  nothing written but the command's own output file;
- anything else: listed, with what was wrong.

A fuzzed plan is clean when `bob certify --plan` certifies it (exit 0), lists its
hazards (exit 1) or refuses it in one line (exit 2). The counts are printed last; exit 1
when anything else happened.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import io
import json
import os
import pickle
import random
import re
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT_SECONDS = 60  # a case still running then has hung: anything else
TEXT = b"the cat sat on the mat; the rat ate the hat. " * 40
REPORT = re.compile(r"bob: interrupted"
                    r"|bob: interrupted at update (\d+); no checkpoint written by this run"
                    r"|bob: interrupted at update (\d+); checkpoint at update (\d+) kept")
# What a run prints before it can fail: its plan line, progress lines, the heartbeat, the
# compile notice.
PROGRESS = re.compile(r"plan: updates |step \d+: train \d|compiling the CPU kernels|\.\.\. \d+:"
                      r"\d\d: |$")

Setup = Callable[[Path], list[str]]  # makes the case's files in its directory; its argv


@dataclass(frozen=True)
class Case:
    fault: str  # the class of fault (as the README's reliability section names them)
    name: str
    setup: Setup
    # "refused"; "stream": read as a stream, exit 0; "ran": exit 0 as documented; "either":
    # refused or ran (a resource limit that may leave room on this machine)
    expect: str = "refused"
    limits: tuple[tuple[int, int], ...] = ()  # (resource, bytes): setrlimit in the child
    writes: tuple[str, ...] = ()  # what a case that runs may write (its output file)


@dataclass(frozen=True)
class Outcome:
    case: str
    verdict: str  # "refused", "stream", "ran", "else"
    why: str = ""


# -- the shared files: made once, copied into each case's directory -------------------
def make_base(base: Path) -> None:
    (base / "a.txt").write_bytes(TEXT)
    run_bob(base, ["train", "--backend", "cpu", "-N", "2", "--steps", "4", "--text", "a.txt",
                   "-c", "m.safetensors"], check=True)
    run_bob(base, ["count", "a.txt", "-o", "a.counts"], check=True)
    run_bob(base, ["train", "--backend", "cpu", "-N", "2", "--steps", "2", "--text", "a.txt",
                   "--shards", "2", "-c", "s.safetensors"], check=True)
    from bob.plan.jsonio import dumps
    from bob.program.bob import BobConfig, build_plan
    (base / "plan.json").write_text(dumps(build_plan(BobConfig(prompts=1, updates=1))))


def bob_env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT / "src"), "BOB_REPORT_DIR":
            os.environ.get("BOB_REPORT_DIR", str(Path(tempfile.gettempdir()) / "bob-audit"))}


def run_bob(cwd: Path, argv: list[str], check: bool = False, stdin: bytes | None = None,
            limits: tuple[tuple[int, int], ...] = ()) -> subprocess.CompletedProcess:
    def limit() -> None:
        for kind, value in limits:
            resource.setrlimit(kind, (value, value))

    env = bob_env()
    if limits:  # OpenBLAS sizes its buffers by the cores: one thread, the same on any host
        env["OPENBLAS_NUM_THREADS"] = "1"
    done = subprocess.run([sys.executable, "-m", "bob", *argv], cwd=cwd, env=env,
                          capture_output=True, timeout=TIMEOUT_SECONDS, check=False,
                          input=stdin if stdin is not None else b"",
                          preexec_fn=limit if limits else None)
    if check and done.returncode != 0:
        raise SystemExit(f"audit set-up failed: bob {' '.join(argv)}: {done.stderr!r}")
    return done


def snapshot(directory: Path) -> dict[str, object]:
    """Every entry under the directory: a regular file's bytes, else what it is (special
    files are never opened: a FIFO would block)."""
    seen: dict[str, object] = {}
    for root, dirs, files in os.walk(directory):
        for name in dirs + files:
            path = Path(root) / name
            rel = str(path.relative_to(directory))
            if path.is_symlink():
                seen[rel] = ("link", os.readlink(path))
            elif path.is_file():
                seen[rel] = path.read_bytes()
            else:
                seen[rel] = "dir" if path.is_dir() else "special"
    return seen


# -- the cases ---------------------------------------------------------------------
def with_metadata(source: Path, target: Path, **changes: str) -> None:
    from safetensors import safe_open
    from safetensors.numpy import load_file, save_file
    with safe_open(str(source), framework="numpy") as file:
        metadata = dict(file.metadata())
    save_file(load_file(str(source)), str(target), metadata={**metadata, **changes})


def fifo(d: Path, name: str = "f") -> str:
    if not os.path.lexists(d / name):
        os.mkfifo(d / name)
    return name


def hostile_checkpoint(**changes: str) -> Setup:
    def setup(d: Path) -> list[str]:
        with_metadata(d / "m.safetensors", d / "h.safetensors", **changes)
        return ["predict", "-c", "h.safetensors", "a"]
    return setup


def hostile_resume(**changes: str) -> Setup:
    def setup(d: Path) -> list[str]:
        with_metadata(d / "m.safetensors", d / "h.safetensors", **changes)
        return ["train", "--backend", "cpu", "--resume", "--text", "a.txt", "--steps", "2",
                "-c", "h.safetensors"]
    return setup


def hostile_counts(command: str, **changes: str) -> Setup:
    def setup(d: Path) -> list[str]:
        with_metadata(d / "a.counts", d / "h.counts", **changes)
        if command == "eval":
            return ["eval", "--backend", "cpu", "-c", "m.safetensors", "--counts", "h.counts"]
        return ["train", "--backend", "cpu", "--steps", "1", "--counts", "h.counts", "-c",
                "new.safetensors"]
    return setup


def huge_integer_field(field: str, digits: int) -> Callable[[dict], str]:
    """The plan as text with one field's value an integer of that many digits (written as
    text: Python's int-to-str limit stops json.dumps at 4300)."""
    def change(data: dict) -> str:
        placeholder = "__HUGE_INTEGER__"
        text = json.dumps({**data, field: placeholder})
        return text.replace(f'"{placeholder}"', "1" + "0" * (digits - 1))
    return change


def plan_file(change: Callable[[dict], object]) -> Setup:
    def setup(d: Path) -> list[str]:
        data = json.loads((d / "plan.json").read_text())
        data = change(data) or data
        (d / "h.json").write_text(data if isinstance(data, str) else json.dumps(data))
        return ["certify", "--plan", "h.json"]
    return setup


def argv_only(*argv: str) -> Setup:
    return lambda d: list(argv)


def after(prepare: Callable[[Path], object], *argv: str) -> Setup:
    def setup(d: Path) -> list[str]:
        prepare(d)
        return list(argv)
    return setup


def many_tensors(count: int) -> Callable[[dict], dict]:
    def change(data: dict) -> dict:
        data["tensors"] = [{**data["tensors"][0], "name": f"t{i}"} for i in range(count)]
        return data
    return change


def sparse_file(name: str, size: int) -> Callable[[Path], None]:
    def make(d: Path) -> None:
        with open(d / name, "wb") as file:
            file.truncate(size)
    return make


def directory_with(kind: str) -> Callable[[Path], None]:
    def make(d: Path) -> None:
        (d / "corpus").mkdir()
        (d / "corpus" / "a.txt").write_bytes(TEXT)
        if kind == "broken link":
            os.symlink(d / "nowhere", d / "corpus" / "b.txt")
        elif kind == "fifo":
            os.mkfifo(d / "corpus" / "b.txt")
        elif kind == "plain":
            pass
        elif kind == "loop":
            os.symlink(d / "corpus" / "c.txt", d / "corpus" / "b.txt")
            os.symlink(d / "corpus" / "b.txt", d / "corpus" / "c.txt")
    return make


def cases() -> list[Case]:
    c: list[Case] = []
    add = c.append
    # Special files: FIFOs, devices and directories where a regular file is needed.
    for argv in (["predict", "-c", "{f}", "a"], ["certify", "--plan", "{f}"],
                 ["eval", "--backend", "cpu", "-c", "{f}", "--text", "a.txt"],
                 ["generate", "-c", "{f}", "-p", "a"], ["export", "-c", "{f}", "-o", "e.st"],
                 ["plot", "-c", "{f}", "--out", "p"],
                 ["train", "--backend", "cpu", "--counts", "{f}", "-c", "n.st"],
                 ["eval", "--backend", "cpu", "-c", "m.safetensors", "--counts", "{f}"],
                 ["train", "--backend", "cpu", "--resume", "--text", "a.txt", "-c", "{f}"],
                 ["predict", "-c", "m.safetensors", "--tokenizer", "{f}", "--ids", "1"]):
        add(Case("special files", "FIFO: " + " ".join(argv),
                 lambda d, argv=argv: [w.replace("{f}", fifo(d)) for w in argv]))
        add(Case("special files", "/dev/zero: " + " ".join(argv),
                 lambda d, argv=argv: [w.replace("{f}", "/dev/zero") for w in argv]))
    add(Case("special files", "input record /dev/zero",
             argv_only("train", "--backend", "cpu", "--input", "/dev/zero", "-c", "n.st")))
    add(Case("special files", "text /dev/null",
             argv_only("train", "--backend", "cpu", "--text", "/dev/null", "-c", "n.st")))
    add(Case("special files", "count /dev/null", argv_only("count", "/dev/null", "-o", "c")))
    add(Case("special files", "text FIFO read as a stream", lambda d: feed_fifo(d), "stream"))
    add(Case("special files", "text from a pipe (stdin) read as a stream",
             argv_only("eval", "--backend", "cpu", "-c", "m.safetensors", "--text", "-"),
             "stream"))
    for kind in ("broken link", "fifo", "loop"):
        add(Case("special files", f"count DIR with a {kind}",
                 after(directory_with(kind), "count", "corpus", "-o", "c.counts")))
    # Hostile checkpoint metadata.
    for field, value in [("step", "9223372036854775803"), ("step", str(10**20)),
                         ("step", "9" * 400), ("step", "-1"), ("step", "1e3"),
                         ("format_version", "9" * 5000), ("vocab", "70000"),
                         ("vocab", "0"), ("lr", "nan"), ("lr", "-1"), ("beta1", "1"),
                         ("history", "[" * 50000 + "]" * 50000), ("history", '[[1, "x"]]'),
                         ("segments", "[" * 50000), ("successors", "[[5, 2]]"),
                         ("format", "other"), ("data_digest", "xyz"),
                         ("optimum", "inf"), ("val_history", "{}")]:
        add(Case("hostile metadata", f"checkpoint {field}={value[:20]}",
                 hostile_checkpoint(**{field: value})))
    for value in ("9223372036854775803", str(2**53 - 1), "9" * 400):
        add(Case("hostile metadata", f"resume at step {value[:20]}",
                 hostile_resume(step=value)))
    for command in ("train", "eval"):
        for field, value in [("sources", "[" * 50000 + "]" * 50000), ("sources", '["ab"]'),
                             ("optimum", "1.0"), ("digest", "v2:" + "0" * 64),
                             ("digest", "0" * 64), ("vocab", "9" * 300),
                             ("transitions", "-5"), ("layout", "sparse")]:
            add(Case("hostile metadata", f"counts {field}={value[:20]} ({command})",
                     hostile_counts(command, **{field: value})))
    add(Case("hostile metadata", "plot counts of other data",
             after(lambda d: (d / "b.txt").write_bytes(b"zyx wvu " * 200)
                   or run_bob(d, ["count", "b.txt", "-o", "b.counts"], check=True),
                   "plot", "-c", "m.safetensors", "--counts", "b.counts", "--out", "p")))
    # Huge, nested and unbounded values.
    add(Case("huge values", "plan of 100000 tensors", plan_file(many_tensors(100_000))))
    add(Case("huge values", "plan nested 100000 deep",
             plan_file(lambda data: "[" * 100_000 + "]" * 100_000)))
    add(Case("huge values", "plan of 300 MB", after(sparse_file("big.json", 300 << 20),
                                                    "certify", "--plan", "big.json")))
    add(Case("huge values", "plan integer of 5000 digits",
             plan_file(huge_integer_field("format_version", 5000))))
    add(Case("huge values", "steps 2**53 + 1",
             argv_only("train", "--backend", "cpu", "--steps", str(2**53 + 1), "-c", "n.st")))
    add(Case("huge values", "steps 2**53 on cpu",
             argv_only("train", "--backend", "cpu", "--steps", str(2**53), "-c", "n.st")))
    add(Case("huge values", "vocab 65537",
             argv_only("count", "--tokens", "a.txt", "--vocab", "65537", "-o", "c")))
    add(Case("huge values", "token above V",
             argv_only("count", "--tokens", "a.txt", "--vocab", "300", "-o", "c")))
    add(Case("huge values", "input record of a huge V",
             after(lambda d: (d / "r.bin").write_bytes(
                 b"BOBINPUT" + (2).to_bytes(4, "little") * 2 + (2**31).to_bytes(4, "little")
                 + (1).to_bytes(4, "little") + (2**60).to_bytes(8, "little")),
                 "train", "--backend", "cpu", "--input", "r.bin", "-c", "n.st")))
    # Outputs that cannot be written; contradictory flags.
    add(Case("outputs", "count -o under a file",
             argv_only("count", "a.txt", "-o", "a.txt/c.counts")))
    add(Case("outputs", "count -o in /proc", argv_only("count", "a.txt", "-o", "/proc/c")))
    add(Case("outputs", "train -c under a file",
             argv_only("train", "--backend", "cpu", "--text", "a.txt", "-c", "a.txt/m.st")))
    add(Case("outputs", "immutable checkpoint", immutable_resume))
    add(Case("outputs", "plot --out a file",
             argv_only("plot", "-c", "m.safetensors", "--out", "a.txt")))
    add(Case("outputs", "export -o existing",
             argv_only("export", "-c", "m.safetensors", "-o", "a.txt")))
    add(Case("outputs", "plan --emit a file", argv_only("plan", "--emit", "a.txt")))
    add(Case("outputs", "--resume --overwrite",
             argv_only("train", "--backend", "cpu", "--resume", "--overwrite", "--text",
                       "a.txt", "-c", "m.safetensors")))
    add(Case("outputs", "--new-data without --resume",
             argv_only("train", "--backend", "cpu", "--new-data", "--text", "a.txt",
                       "-c", "n.st")))
    add(Case("outputs", "existing checkpoint without --resume",
             argv_only("train", "--backend", "cpu", "--text", "a.txt", "-c", "m.safetensors")))
    add(Case("outputs", "--result same as checkpoint",
             argv_only("train", "--backend", "cpu", "--text", "a.txt", "-c", "n.st",
                       "--result", "n.st")))
    # Symlinks.
    add(Case("symlinks", "dangling --text",
             after(lambda d: os.symlink(d / "none", d / "l.txt"), "train", "--backend", "cpu",
                   "--text", "l.txt", "-c", "n.st")))
    add(Case("symlinks", "looping -c",
             after(lambda d: (os.symlink(d / "y", d / "x"), os.symlink(d / "x", d / "y")),
                   "predict", "-c", "x", "a")))
    add(Case("symlinks", "-c a link to a directory",
             after(lambda d: (d / "dd").mkdir() or os.symlink(d / "dd", d / "l.st"),
                   "predict", "-c", "l.st", "a")))
    # A full disk: a tmpfs of a few kilobytes, where it can be mounted.
    for argv in (["train", "--backend", "cpu", "--text", "a.txt", "--steps", "2", "-c",
                  "{t}/m.st"], ["count", "a.txt", "-o", "{t}/c.counts"],
                 ["plan", "--emit", "{t}/emit"], ["export", "-c", "m.safetensors", "-o",
                                                  "{t}/e.st"]):
        add(Case("full disk", "full disk: " + " ".join(argv),
                 lambda d, argv=argv: [w.replace("{t}", full_disk(d)) for w in argv]))
    # A file-size limit (ulimit -f): the write fails as on a full disk.
    for argv, size in ((["export", "-c", "m.safetensors", "-o", "e.st"], 64 << 10),
                       (["export", "-c", "m.safetensors", "-o", "a.txt", "--overwrite"],
                        64 << 10),
                       (["count", "a.txt", "-o", "c.counts"], 1 << 10),
                       (["train", "--backend", "cpu", "--text", "a.txt", "--steps", "2", "-N",
                         "2", "-c", "n.st"], 64 << 10),
                       (["train", "--backend", "cpu", "--text", "a.txt", "--steps", "2", "-N",
                         "2", "-c", "m.safetensors", "--resume"], 64 << 10)):
        add(Case("full disk", f"ulimit -f {size >> 10} KiB: " + " ".join(argv),
                 argv_only(*argv), limits=((resource.RLIMIT_FSIZE, size),)))
    # Usage errors, on every command.
    usage = [["train", "--text", "."], ["train", "--lr", "-1"], ["train", "--steps", "x"],
             ["train", "--no-such"], ["train", "--backend", "tpu"], ["train", "--text"],
             ["train", "--schedule", "slow"], ["predict"], ["predict", "-c", "."],
             ["predict", "-c", "none.st", "a"], ["generate", "-c", "m.safetensors"],
             ["generate", "-c", "m.safetensors", "-p", "a", "-t", "-1"],
             ["eval", "-c", "m.safetensors"], ["eval", "--no-such"], ["export", "-c",
                                                                      "m.safetensors"],
             ["plot", "--counts", "."], ["plan", "-V", "1"], ["plan", "--mode", "soft"],
             ["plan", "--arch", "sm_1"], ["certify", "--plan", "none.json"],
             ["check", "--backends", "cpu"], ["doctor", "--no-such"], ["count"],
             ["count", "--tokens", "a.txt"], ["count", "none.txt"], ["profile", "-V", "x"],
             ["bench", "-N", "-3"], ["no-such-command"], ["--no-such"],
             ["train", "--unreadable"]]
    for argv in usage:
        add(Case("usage errors", "bob " + " ".join(argv), argv_only(*argv)))
    add(Case("usage errors", "unreadable -c", unreadable_checkpoint))
    c += pickle_cases() + json_cases() + empty_path_cases() + alias_cases() \
        + extreme_number_cases() + limit_cases()
    return c


# -- pickles of mixed types ----------------------------------------------------------
class _Outside(pickle.Pickler):
    """Pickles "b" as a persistent id: an object kept outside the file."""

    def persistent_id(self, obj: object) -> str | None:
        return "kept elsewhere" if obj == "b" else None


def meta_pickle(meta: object, argv: tuple[str, ...], outside: bool = False) -> Setup:
    """A meta.pkl holding `meta` (pickled with a persistent id where `outside`), then
    `argv` with {m} for its name."""
    def setup(d: Path) -> list[str]:
        with open(d / "meta.pkl", "wb") as file:
            (_Outside(file, protocol=2) if outside else pickle.Pickler(file, 4)).dump(meta)
        (d / "t.bin").write_bytes(bytes([0, 0, 1, 0, 2, 0, 1, 0, 0, 0]))  # uint16 0 1 2 1 0
        return [w.replace("{m}", "meta.pkl") for w in argv]
    return setup


def pickle_cases() -> list[Case]:
    good_itos, good_stoi = {0: "a", 1: "b", 2: "c"}, {"a": 0, "b": 1, "c": 2}
    metas = {
        "itos of int and str keys": {"vocab_size": 3, "itos": {0: "a", "b": 1, 2: "c"},
                                     "stoi": good_stoi},
        "itos of str keys": {"vocab_size": 3, "itos": {"0": "a", "1": "b", "2": "c"},
                             "stoi": good_stoi},
        "stoi value a dict": {"vocab_size": 3, "itos": good_itos,
                              "stoi": {"a": 0, "b": {"x": 1}, "c": 2}},
        "stoi of an int key": {"vocab_size": 3, "itos": good_itos,
                               "stoi": {"a": 0, 1: "b", "c": 2}},
        "vocab_size a str": {"vocab_size": "3", "itos": good_itos, "stoi": good_stoi},
        "vocab_size a bool": {"vocab_size": True, "itos": good_itos, "stoi": good_stoi},
        "a list": [good_itos, good_stoi],
        "a tuple key": {"vocab_size": 3, "itos": {(0,): "a"}, "stoi": good_stoi},
        "a set": {"vocab_size": 3, "itos": good_itos, "stoi": {"a", "b", "c"}},
        "bytes values": {"vocab_size": 3, "itos": {0: b"a", 1: b"b", 2: b"c"},
                         "stoi": good_stoi},
        "a float vocab": {"vocab_size": 3.0, "itos": good_itos, "stoi": good_stoi},
    }
    found = []
    for argv in (("predict", "-c", "m.safetensors", "--tokenizer", "{m}", "--ids", "1"),
                 ("count", "--tokens", "t.bin", "--tokenizer", "{m}", "-o", "c.counts")):
        for name, meta in metas.items():
            found.append(Case("mixed-type pickles", f"meta.pkl {name}: {argv[0]}",
                              meta_pickle(meta, argv)))
        found.append(Case("mixed-type pickles", f"meta.pkl with a persistent id: {argv[0]}",
                          meta_pickle({"vocab_size": 3, "itos": good_itos,
                                       "stoi": good_stoi}, argv, outside=True)))
    return found


# -- JSON values that are no strings where strings belong ----------------------------
def hostile_index(change: Callable[[dict], object], argv: tuple[str, ...] = ("predict", "-c",
                  "s.safetensors.index.json", "a")) -> Setup:
    """The sharded checkpoint's index changed in place, then `argv`."""
    def setup(d: Path) -> list[str]:
        index = d / "s.safetensors.index.json"
        document = json.loads(index.read_text())
        document = change(document) or document
        index.write_text(json.dumps(document))
        return list(argv)
    return setup


def set_path(*path: object, value: object) -> Callable[[dict], dict]:
    def change(document: dict) -> dict:
        node = document
        for key in path[:-1]:
            node = node[key]
        node[path[-1]] = value
        return document
    return change


def first_tensor(document: dict) -> str:
    return sorted(document["weight_map"])[0]


def json_cases() -> list[Case]:
    found = []
    for value in ([["s"]], {"file": "x"}, 7, None, True, 1.5):
        found.append(Case("non-string JSON", f"index weight_map value {json.dumps(value)}",
                          hostile_index(lambda doc, value=value: set_path(
                              "weight_map", first_tensor(doc), value=value)(doc))))
    for key, value in (("file", ["x"]), ("file", 5), ("sha256", 12), ("rows", ["0", "128"]),
                       ("bytes", "10"), ("file", {"a": 1})):
        found.append(Case("non-string JSON", f"index shard {key} {json.dumps(value)}",
                          hostile_index(set_path("metadata", "shards", 0, key, value=value))))
    for key, value in (("vocab", 256), ("step", 2), ("format", ["bob-checkpoint"]),
                       ("data_digest", None), ("lr", 0.1)):
        found.append(Case("non-string JSON", f"index metadata {key} {json.dumps(value)}",
                          hostile_index(set_path("metadata", key, value=value))))
    found.append(Case("non-string JSON", "index metadata shards an object",
                      hostile_index(set_path("metadata", "shards", value={"0": 1}))))
    found.append(Case("non-string JSON", "index weight_map a list",
                      hostile_index(set_path("weight_map", value=[]))))
    found.append(Case("non-string JSON", "index a list", hostile_index(lambda doc: [doc])))
    found.append(Case("non-string JSON", "export of a hostile index",
                      hostile_index(lambda doc: set_path("weight_map", first_tensor(doc),
                                                         value=[1])(doc),
                                    ("export", "-c", "s.safetensors.index.json", "-o",
                                     "e.st"))))
    segment = {"first_step": 0, "data_digest": "", "lr": 0.1, "beta1": 0.9, "beta2": 0.999,
               "eps": 1e-8, "weight_decay": 0.01}
    for field, value in (
            ("segments", json.dumps([{**segment, "data_digest": [1]}])),
            ("segments", json.dumps([{**segment, "data_digest": {"a": 1}}])),
            ("segments", json.dumps([segment]).replace('"lr": 0.1', '"lr": 1' + "0" * 400)),
            ("segments", json.dumps([{**segment, "first_step": "0"}])),
            ("history", '[["0", 1.0]]'), ("history", "[[0, " + "9" * 400 + "]]"),
            ("val_history", '[{"step": 1}]'), ("successors", '[["a", "b"]]'),
            ("successors", "[]"), ("successors", "[[0, " + "9" * 400 + "]]"),
            ("successors", '{"0": 1}')):
        found.append(Case("non-string JSON", f"checkpoint {field}={value[:24]}",
                          hostile_checkpoint_generate(**{field: value})))
    for value in ('[[1, 2]]', '[[["a"], 3]]', '[["a", "3"]]', '{"a": 1}'):
        found.append(Case("non-string JSON", f"counts sources={value}",
                          hostile_counts("eval", sources=value)))
    return found


def hostile_checkpoint_generate(**changes: str) -> Setup:
    def setup(d: Path) -> list[str]:
        with_metadata(d / "m.safetensors", d / "h.safetensors", **changes)
        return ["generate", "-c", "h.safetensors", "-p", "a", "-n", "5"]
    return setup


# -- empty paths ---------------------------------------------------------------------
def empty_path_cases() -> list[Case]:
    found = []
    for argv in (["train", "--backend", "cpu", "--text", "", "-c", "n.st"], ["count", ""],
                 ["count", "", "-o", "c.counts"],
                 ["eval", "--backend", "cpu", "-c", "m.safetensors", "--text", ""],
                 ["count", "--tokens", "", "--vocab", "300"],
                 ["train", "--backend", "cpu", "--counts", "", "-c", "n.st"],
                 ["eval", "--backend", "cpu", "-c", "m.safetensors", "--counts", ""],
                 ["train", "--backend", "cpu", "--text", "a.txt", "--val-text", "", "-c",
                  "n.st"],
                 ["train", "--backend", "cpu", "--text", "a.txt", "--val-counts", "", "-c",
                  "n.st"],
                 ["train", "--backend", "cpu", "--input", "", "-c", "n.st"],
                 ["predict", "-c", "", "a"], ["generate", "-c", "", "-p", "a"],
                 ["export", "-c", "m.safetensors", "-o", ""], ["export", "-c", "", "-o", "e"],
                 ["count", "a.txt", "-o", ""],
                 ["train", "--backend", "cpu", "--text", "a.txt", "-c", ""],
                 ["train", "--backend", "cpu", "--text", "a.txt", "-c", "n.st", "--result",
                  ""],
                 ["predict", "-c", "m.safetensors", "--tokenizer", "", "--ids", "1"],
                 ["certify", "--plan", ""], ["plot", "-c", "m.safetensors", "--out", ""],
                 ["plot", "-c", "m.safetensors", "--counts", "", "--out", "p"]):
        found.append(Case("empty paths", "bob " + " ".join(w or "''" for w in argv),
                          argv_only(*argv)))
    return found


# -- outputs that are inputs under another name ----------------------------------------
def named_again(how: str, target: str, name: str) -> Callable[[Path], str]:
    """`name` made another name of `target` (a symbolic link, a hard link, the path
    through a link to the directory, or the same path); what the case gives as it."""
    def make(d: Path) -> str:
        if how == "symlink":
            os.symlink(target, d / name)
        elif how == "hard link":
            os.link(d / target, d / name)
        elif how == "directory link":
            os.symlink(".", d / "here")
            return f"here/{target}"
        else:
            return target
        return name
    return make


def aliased(how: str, target: str, name: str, *argv: str) -> Setup:
    """`argv` with {o} replaced by another name of `target`."""
    def setup(d: Path) -> list[str]:
        alias = named_again(how, target, name)(d)
        return [w.replace("{o}", alias) for w in argv]
    return setup


def alias_cases() -> list[Case]:
    found = []
    for how in ("same", "symlink", "hard link", "directory link"):
        found += [
            Case("output = input", f"export -o the checkpoint ({how})",
                 aliased(how, "m.safetensors", "e.st", "export", "-c", "m.safetensors",
                         "-o", "{o}", "--overwrite")),
            Case("output = input", f"count -o its input ({how})",
                 aliased(how, "a.txt", "s.txt", "count", "a.txt", "-o", "{o}",
                         "--overwrite")),
            Case("output = input", f"train -c its text ({how})",
                 aliased(how, "a.txt", "s.st", "train", "--backend", "cpu", "--text",
                         "a.txt", "-c", "{o}", "--overwrite")),
            Case("output = input", f"train -c its counts ({how})",
                 aliased(how, "a.counts", "s.st", "train", "--backend", "cpu", "--counts",
                         "a.counts", "-c", "{o}", "--overwrite")),
        ]
    found += [
        Case("output = input", "export -o a shard of its checkpoint",
             lambda d: ["export", "-c", "s.safetensors.index.json", "-o",
                        json.loads((d / "s.safetensors.index.json").read_text())
                        ["metadata"]["shards"][1]["file"], "--overwrite"]),
        Case("output = input", "export -o its checkpoint's index",
             argv_only("export", "-c", "s.safetensors", "-o", "s.safetensors.index.json",
                       "--overwrite")),
        Case("output = input", "count DIR -o a file in DIR",
             after(directory_with("plain"), "count", "corpus", "-o", "corpus/a.txt",
                   "--overwrite")),
        Case("output = input", "count GLOB -o a file it matches",
             argv_only("count", "*.txt", "-o", "a.txt", "--overwrite")),
        Case("output = input", "train -c its validation text",
             after(lambda d: (d / "v.txt").write_bytes(TEXT[::-1]), "train", "--backend",
                   "cpu", "--text", "a.txt", "--val-text", "v.txt", "-c", "v.txt",
                   "--overwrite")),
        Case("output = input", "train --result its text",
             argv_only("train", "--backend", "cpu", "--text", "a.txt", "-c", "n.st",
                       "--result", "a.txt")),
        Case("output = input", "train --keep-best linked to the checkpoint",
             after(lambda d: os.symlink("m.safetensors", d / "m.best.safetensors"), "train",
                   "--backend", "cpu", "--text", "a.txt", "--val-text", "a.txt",
                   "--keep-best", "-c", "m.safetensors", "--overwrite")),
        Case("output = input", "train -c its tokenizer",
             meta_pickle({"vocab_size": 3, "itos": {0: "a", 1: "b", 2: "c"},
                          "stoi": {"a": 0, "b": 1, "c": 2}},
                         ("train", "--backend", "cpu", "--tokens", "t.bin", "--tokenizer",
                          "{m}", "-c", "{m}", "--overwrite"))),
        Case("output = input", "plot over its checkpoint",
             after(lambda d: shutil.copy(d / "m.safetensors", d / "loss.png"), "plot", "-c",
                   "loss.png", "--out", ".")),
    ]
    return found


# -- extreme numeric options -----------------------------------------------------------
def extreme_number_cases() -> list[Case]:
    found = []
    generate = ("generate", "-c", "m.safetensors", "-p", "a", "-n", "30")
    for argv in (("-t", "1e-45"), ("-t", "1e-39"), ("-t", "1e-320"), ("-t", "1e-30"),
                 ("-t", "5e-324"), ("-t", "1e308"), ("-t", "3.5e38"),
                 ("-t", "1e-45", "--top-k", "1"), ("-t", "1e-45", "--no-seen-only"),
                 ("--top-k", str(10**30)), ("--seed", str(10**30)),
                 ("-t", "1e-45", "--num-samples", "3")):
        found.append(Case("extreme numbers", "generate " + " ".join(argv),
                          argv_only(*generate, *argv), "ran"))
    train = ("train", "--backend", "cpu", "--text", "a.txt", "-N", "2", "--steps", "4", "-c",
             "n.st")
    for argv in (("--lr", "1e-45"), ("--beta2", "0.9999999999999999"),
                 ("--save-every", "1e-300"), ("--eps", "1e-30")):
        found.append(Case("extreme numbers", "train " + " ".join(argv),
                          argv_only(*train, *argv), "ran", writes=("n.st",)))
    for argv in (generate + ("-t", "nan"), generate + ("-t", "inf"),
                 generate + ("-t", "-1e-45"), generate + ("-n", str(10**20)),
                 generate + ("--num-samples", str(10**20)),
                 train + ("--lr", "1e308"), train + ("--eps", "1e-320"),
                 train + ("--weight-decay", "1e308"), train + ("--lr", "1e-400"),
                 train + ("--beta1", "0.99999999999999999"), train + ("--lr", "nan"),
                 train + ("--device-memory", "1")):
        found.append(Case("extreme numbers", "bob " + " ".join(argv[-2:]) + f" ({argv[0]})",
                          argv_only(*argv)))
    return found


# -- address-space limits ------------------------------------------------------------
def limit_cases() -> list[Case]:
    """`ulimit -v`: memory runs out (one line, exit 1) or, where the limit leaves room on
    this machine, the command runs."""
    found = []
    for megabytes, argv, writes in (
            (150, ("train", "--backend", "cpu", "--text", "a.txt", "--steps", "4", "-N", "2",
                   "-c", "n.st"), ("n.st",)),
            (200, ("train", "--backend", "cpu", "--text", "a.txt", "--steps", "4", "-N", "2",
                   "-c", "n.st"), ("n.st",)),
            (300, ("train", "--backend", "cpu", "--text", "a.txt", "--steps", "4", "-N", "2",
                   "-c", "n.st"), ("n.st",)),
            (400, ("train", "--backend", "cpu", "--text", "a.txt", "--steps", "4", "-N", "2",
                   "-c", "n.st"), ("n.st",)),
            (150, ("count", "a.txt", "-o", "c.counts"), ("c.counts",)),
            (150, ("generate", "-c", "m.safetensors", "-p", "a"), ()),
            (200, ("predict", "--backend", "cpu", "-c", "m.safetensors", "a"), ()),
            (250, ("eval", "--backend", "cpu", "-c", "m.safetensors", "--text", "a.txt"), ()),
            (150, ("export", "-c", "m.safetensors", "-o", "e.st"), ("e.st",))):
        found.append(Case("address-space limits", f"ulimit -v {megabytes} MiB: {argv[0]}",
                          argv_only(*argv), "either",
                          limits=((resource.RLIMIT_AS, megabytes << 20),), writes=writes))
    return found


def feed_fifo(d: Path) -> list[str]:
    os.mkfifo(d / "t.fifo")

    def feed() -> None:
        with open(d / "t.fifo", "wb") as writer:  # blocks until bob opens it
            writer.write(TEXT)
    threading.Thread(target=feed, daemon=True).start()
    return ["eval", "--backend", "cpu", "-c", "m.safetensors", "--text", "t.fifo"]


def immutable_resume(d: Path) -> list[str]:
    subprocess.run(["chattr", "+i", str(d / "m.safetensors")], capture_output=True,
                   check=False)
    return ["train", "--backend", "cpu", "--resume", "--text", "a.txt", "--steps", "2",
            "-c", "m.safetensors"]


def unreadable_checkpoint(d: Path) -> list[str]:
    # Root reads a file of mode 000: a directory entry that cannot be read is a
    # checkpoint made of a link into /proc's unreadable files instead.
    (d / "u.st").write_bytes(b"x")
    os.chmod(d / "u.st", 0)
    return ["predict", "-c", "u.st" if os.geteuid() else "/proc/1/mem", "a"]


_mounts: list[Path] = []


def full_disk(d: Path) -> str:
    """A directory on a full file system: a 64 KiB tmpfs (filled) where mounting works,
    else a directory beside the case (the case then tests nothing of a full disk)."""
    target = d / "full"
    if target.exists():
        return "full"
    target.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(target)],
                             capture_output=True, check=False).returncode == 0
    if mounted:
        _mounts.append(target)
        with contextlib.suppress(OSError), open(target / "filler", "wb") as filler:
            filler.write(bytes(1 << 20))
    return "full"


def unmount_all() -> None:
    while _mounts:
        subprocess.run(["umount", str(_mounts.pop())], capture_output=True, check=False)


# -- running one case ----------------------------------------------------------------
def judge(case: Case, base: Path, work: Path) -> Outcome:
    directory = work / "case"
    shutil.rmtree(directory, ignore_errors=True)
    shutil.copytree(base, directory, symlinks=True)
    try:
        argv = case.setup(directory)
        before = snapshot(directory)
        try:
            done = run_bob(directory, argv, stdin=TEXT,  # for a case that reads "-"
                           limits=case.limits)
        except subprocess.TimeoutExpired:
            return Outcome(case.name, "else", f"still running after {TIMEOUT_SECONDS} s")
        err = done.stderr.decode(errors="replace")
        lines = err.strip().splitlines()
        if "Traceback" in err or "internal error" in err:
            return Outcome(case.name, "else", f"exit {done.returncode}: {err[-300:]!r}")
        if case.expect == "stream":
            if done.returncode == 0:
                return Outcome(case.name, "stream")
            return Outcome(case.name, "else", f"exit {done.returncode}: {err[-300:]!r}")
        if case.expect in ("ran", "either") and done.returncode == 0:
            if "Warning" in err:
                return Outcome(case.name, "else", f"a warning: {err[-300:]!r}")
            after = snapshot(directory)
            if any(after.get(name) != value for name, value in before.items()
                   if name not in case.writes) or set(after) - set(before) - set(case.writes):
                return Outcome(case.name, "else", "the directory changed beyond its output")
            return Outcome(case.name, "ran")
        if case.expect == "ran":
            return Outcome(case.name, "else", f"exit {done.returncode}: {err[-300:]!r}")
        if done.returncode not in (1, 2):
            return Outcome(case.name, "else", f"exit {done.returncode}: {err[-300:]!r}")
        # One line; a failure at run time (exit 1) may follow the run's progress lines.
        progress = done.returncode == 1 and all(PROGRESS.match(line) for line in lines[:-1])
        if not lines or not lines[-1].startswith("bob") or (len(lines) != 1 and not progress):
            return Outcome(case.name, "else", f"{len(lines)} lines: {err[-300:]!r}")
        if snapshot(directory) != before:
            return Outcome(case.name, "else", "the directory changed")
        return Outcome(case.name, "refused")
    finally:
        unmount_all()
        subprocess.run(["chattr", "-R", "-i", str(directory)], capture_output=True,
                       check=False)
        shutil.rmtree(directory, ignore_errors=True)


# -- stop signals at moments ---------------------------------------------------------
def catches(pid: int, signum: int) -> bool:
    with contextlib.suppress(OSError), open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("SigCgt:"):
                return bool(int(line.split()[1], 16) >> (signum - 1) & 1)
    return False


def signal_moment(base: Path, work: Path, index: int) -> Outcome:
    """Signal `index`: SIGINT or SIGTERM (alternately), once or twice, at a time after the
    handler is set (start-up, imports) or after the first checkpoint (training, saves)."""
    signum = (signal.SIGINT, signal.SIGTERM)[index % 2]
    late = index % 4 >= 2
    offset = (index // 4) * 0.07
    twice = index % 5 == 4
    name = (f"{signal.Signals(signum).name}{' twice' if twice else ''} "
            f"{'after the first checkpoint' if late else 'after the handler'} +{offset:.2f}s")
    directory = work / "signal"
    shutil.rmtree(directory, ignore_errors=True)
    directory.mkdir()
    shutil.copy(base / "a.txt", work / "a.txt")
    process = subprocess.Popen(
        [sys.executable, "-m", "bob", "train", "--backend", "cpu", "--text",
         str(work / "a.txt"), "-N", "1", "--steps", "100000", "-c", "m.st"], cwd=directory,
        env=bob_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + TIMEOUT_SECONDS
        while not (os.path.exists(directory / "m.st") if late
                   else catches(process.pid, signal.SIGTERM)):
            if process.poll() is not None or time.monotonic() > deadline:
                return Outcome(name, "else", "the moment never came")
            time.sleep(0.001)
        time.sleep(offset)
        process.send_signal(signum)
        if twice:
            time.sleep(0.05)
            process.send_signal(signum)
        _, err_bytes = process.communicate(timeout=TIMEOUT_SECONDS)
    except subprocess.TimeoutExpired:
        return Outcome(name, "else", "still running after the signal")
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    err = err_bytes.decode(errors="replace")
    lines = err.strip().splitlines()
    found = REPORT.fullmatch(lines[-1]) if lines else None
    if process.returncode != 128 + signum or found is None or "Traceback" in err \
            or not all(PROGRESS.match(line) for line in lines[:-1]):
        return Outcome(name, "else", f"exit {process.returncode}: {err[-300:]!r}")
    left = sorted(os.listdir(directory))
    kept = found.group(3)
    if left != ([] if kept is None else ["m.st"]):
        return Outcome(name, "else", f"left {left} after {lines[-1]!r}")
    if kept is not None:
        from bob.records.checkpoint import Checkpoint
        if Checkpoint.load(directory / "m.st").step != int(kept):
            return Outcome(name, "else", f"the file is not update {kept}")
    return Outcome(name, "refused")


# -- fuzzed plans --------------------------------------------------------------------
HOSTILE_VALUES = [None, -1, 0, 2**64, 2**63 - 1, -(2**63), 1.5, float("nan"), "", "x" * 300,
                  [], {}, [[[]]], True, "0x10", 10**400]


def mutated(plan: dict, rng: random.Random) -> dict:
    """The plan with one to three values somewhere inside it replaced by hostile ones."""
    doc = copy.deepcopy(plan)
    for _ in range(rng.randint(1, 3)):
        node, key = doc, None
        path: list[tuple[object, object]] = []
        while isinstance(node, dict | list) and node and (not path or rng.random() < 0.8):
            key = rng.choice(list(node)) if isinstance(node, dict) else rng.randrange(len(node))
            path.append((node, key))
            node = node[key]
        if not path:
            continue
        parent, key = path[-1]
        choice = rng.random()
        if choice < 0.6:
            parent[key] = rng.choice(HOSTILE_VALUES)
        elif choice < 0.8 and isinstance(node, int) and not isinstance(node, bool):
            parent[key] = node + rng.choice([-1, 1, 4096, -4096, 2**32])
        elif isinstance(parent, list):
            parent.append(copy.deepcopy(parent[key]))  # a duplicate entry
        else:
            del parent[key]
    return doc


def fuzz_plans(base: Path, work: Path, count: int, seed: int) -> list[Outcome]:
    from bob.cli.main import main

    plan = json.loads((base / "plan.json").read_text())
    rng = random.Random(seed)
    path = work / "fuzzed.json"
    outcomes = []
    for number in range(count):
        path.write_text(json.dumps(mutated(plan, rng)))
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            status = main(["certify", "--plan", str(path)])
        text = err.getvalue() + out.getvalue()
        clean = (status == 0 or status == 1 and "hazard" in text
                 or status == 2 and len(err.getvalue().strip().splitlines()) == 1)
        if clean and "Traceback" not in text and "internal error" not in text:
            outcomes.append(Outcome(f"plan {number}", "refused"))
        else:
            outcomes.append(Outcome(f"fuzzed plan {number} (seed {seed})", "else",
                                    f"exit {status}: {text[-300:]!r}"))
    return outcomes


# -- the audit -----------------------------------------------------------------------
def audit(quick: bool, signals: int, plans: int, seed: int,
          only: frozenset[str] | None = None) -> dict[str, list[Outcome]]:
    chosen = [case for case in cases() if only is None or case.fault in only]
    if quick:  # the first two cases of each class
        faults = [case.fault for case in chosen]
        chosen = [case for number, case in enumerate(chosen)
                  if faults[:number].count(case.fault) < 2]
    found: dict[str, list[Outcome]] = {}
    with tempfile.TemporaryDirectory(prefix="bob-audit-") as scratch:
        base, work = Path(scratch) / "base", Path(scratch) / "work"
        base.mkdir()
        work.mkdir()
        make_base(base)
        for case in chosen:
            found.setdefault(case.fault, []).append(judge(case, base, work))
        found["signals"] = [signal_moment(base, work, i) for i in range(signals)]
        found["fuzzed plans"] = fuzz_plans(base, work, plans, seed)
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="two cases of each class")
    parser.add_argument("--signals", type=int, default=None, help="signal moments (40)")
    parser.add_argument("--plans", type=int, default=None, help="fuzzed plans (2000)")
    parser.add_argument("--seed", type=int, default=0, help="the plan fuzz's seed")
    parser.add_argument("--json", action="store_true", help="the counts as JSON")
    parser.add_argument("--only", default=None, metavar="CLASS,...",
                        help="only these classes of cases (as the counts name them)")
    args = parser.parse_args(argv)
    signals = args.signals if args.signals is not None else (4 if args.quick else 40)
    plans = args.plans if args.plans is not None else (50 if args.quick else 2000)
    only = None if args.only is None else frozenset(args.only.split(","))
    found = audit(args.quick, signals, plans, args.seed, only)
    totals = {"tried": 0, "refused cleanly": 0, "read as a stream": 0,
              "ran as documented": 0, "anything else": 0}
    rows = []
    for fault, outcomes in found.items():
        counts = [sum(o.verdict == v for o in outcomes)
                  for v in ("refused", "stream", "ran", "else")]
        rows.append((fault, len(outcomes), *counts))
        for key, value in zip(totals, (len(outcomes), *counts), strict=True):
            totals[key] += value
    failures = [o for outcomes in found.values() for o in outcomes if o.verdict == "else"]
    if args.json:
        print(json.dumps({"totals": totals, "classes": {r[0]: dict(zip(totals, r[1:],
                                                                     strict=True))
                                                       for r in rows},
                          "anything_else": [[o.case, o.why] for o in failures]}))
    else:
        print(f"{'class':<22} {'tried':>6} {'refused':>8} {'stream':>7} {'ran':>5} "
              f"{'else':>5}")
        for row in rows:
            print(f"{row[0]:<22} {row[1]:>6} {row[2]:>8} {row[3]:>7} {row[4]:>5} {row[5]:>5}")
        print(f"{'total':<22} {totals['tried']:>6} {totals['refused cleanly']:>8} "
              f"{totals['read as a stream']:>7} {totals['ran as documented']:>5} "
              f"{totals['anything else']:>5}")
        for outcome in failures:
            print(f"anything else: {outcome.case}: {outcome.why}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
