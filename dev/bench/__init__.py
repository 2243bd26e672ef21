"""Bob beside its peers, per AdamW update, in one process.

    bob bench                                  # the tables for the hardware present
    bob bench --backend cuda --backend cpu --vocab 256 --vocab 8192 --repeats 5 --json
    bob bench --backend cuda -V 50257 --mode corpus -r 3    # GPT-2's vocabulary

Every contender trains the same thing from a zero table and zero moments, with
AdamW at lr 0.1, betas (0.9, 0.999), eps 1e-8, weight decay 0.01: the
hard-target objective (mean over the V rows of the cross-entropy of one random
target per row), or with ``--mode corpus`` the corpus objective (the sum over
rows of sum_n T[r][n] (lse_r - W[r][n])) on the same weights T: a sparse random
corpus of ``typical_pairs(V)`` pairs, or the pairs of ``--tokens FILE`` counted
with Bob's counter (``workload``). Bob's arena scatters the sparse record; each
peer builds T dense on its own device. A timing is N updates from that state; it is repeated and
the median kept, after one untimed warm-up (compilation, graph capture, plan
building and certification stay out of the numbers). Each contender runs as
its users would run it:

- Bob (``cuda`` or ``cpu``): ``Session.invoke`` of an N-update plan (load
  the checkpoint and input, write N updates' AdamW scalars, run, read back and
  check), and, separately, the run alone (``backend.run`` over all
  submissions: on ``cuda`` one graph launch and a stream synchronize). The
  host's share of an invocation is timed piece by piece: ``set_scalars`` of the
  N AdamW launches, loading the checkpoint and input, collecting the results.
  In the cuda tables the same rows run on ``nv`` (Bob's own command stream) at
  every V, both schedules with nv's default policy (``--submission auto``:
  chained), and the seed schedule per-launch beside them (``bob nv per-launch``).
- PyTorch eager: ``F.cross_entropy(W, targets)`` (corpus:
  ``-(T * F.log_softmax(W, dim=1)).sum()``), ``backward()``,
  ``torch.optim.AdamW.step()`` (default implementation) per update.
- PyTorch with a CUDA graph: that step captured once (``capturable=True``)
  and replayed N times.
- JAX: ``jit`` of a ``fori_loop`` over N updates, AdamW written in ``jnp``
  as torch.optim.AdamW computes it, state buffers donated.
- NumPy: the float32 loop a user would write (``numpy_train``).
- PyTorch on the CPU: the eager loop above.

In corpus mode Bob starts as ``bob train`` does (zero tables cleared on the
device) and reads the tables back only where ``bob train`` would (checkpoints
up to 256 MiB); the host pieces and the hard-mode command row give way to two
whole processes, start to exit, each with its peak RSS: ``bob train --tokens
--val-tokens --steps N -N N --schedule fused`` (counting, validation, the
checkpoint saved) and ``dev/bench/torch_corpus.py``, PyTorch's eager loop end
to end (the tokens read and counted on its device, T built, the N updates),
on the given token files or a token corpus made for V; "vs bob command" is
their ratio. At V = 50257 a table is 10 GB: each GPU peer is made only where
its estimated tables (``peers.PEAK_TABLES``) fit the device's free memory, and
one that runs out of memory anyway is reported as skipped with the reason.

A row's ratio is its time over Bob's: over Bob's run (the device program
alone, comparable with the peers' training loops, which read and write no
checkpoint) and over Bob's whole invocation. Bandwidth counts 24 bytes per
parameter per update: one read and one write of W, m and v, the least any
AdamW step moves (a fused step computes the gradient on the fly). Bob's seed
schedule itself moves 36: the loss-gradient launch reads W and writes the
gradient, then AdamW reads W, g, m, v and writes W, m, v.

A contender that cannot run here (no torch, no JAX, no GPU, no room) is reported as
skipped; one that fails is reported with its error and the others still run.

The package sits beside the product, not in it: nothing in Bob imports it but
the ``bob bench`` command (``bob.cli.bench_cmd``) and the scripts in ``dev/bench`` and ``dev/cuda``.

- ``tables``: rows, tables and the report (JSON);
- ``workload``: what a table trains on (targets, a random corpus, a token file's pairs)
  and the token files of the whole commands;
- ``peers``: the objectives, the plain NumPy loops, the PyTorch and JAX contenders, their
  device memory;
- ``processes``: a command as a process, its wall time and peak RSS;
- ``measurement``: timing, Bob's rows (invocation, run, host pieces, the commands), the
  memory floor;
- ``suite``: which tables for which devices and V, and ``run_bench``;
- ``torch_corpus``: PyTorch's eager loop on a token corpus end to end (a script);
- ``bench_tokens``: the V = 50257 acceptance run of Bob's commands (a script).
"""
