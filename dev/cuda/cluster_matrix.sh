#!/bin/bash
# The cluster kernel variants of docs/BENCHMARKS.md ("Corpus weights from L2"), in one
# device run: dev/cuda/bench_cluster.py on the knob source, then the shipped kernels
# through the plan on both backends.
export PYTHONPATH=src:.
B="python3 -m dev.cuda.bench_cluster -r 2"
set -x
$B -V 50257 --mode hard --no-check
$B -V 50257 --mode corpus
$B -V 50257 --mode hard --threads 544 --no-check
$B -V 50257 --mode corpus --threads 544 --no-check
$B -V 50257 --mode hard --threads 544 -D CLUSTER_PIPELINED_FOLD=1
$B -V 50257 --mode hard --threads 576 -D CLUSTER_PIPELINED_FOLD=1 --no-check
$B -V 50257 --mode corpus --threads 544 -D CLUSTER_PIPELINED_FOLD=1
$B -V 65536 --mode corpus --no-check
$B -V 65536 --mode corpus --stream-weights --no-check
$B -V 65536 --mode hard --threads 544 --no-check
python3 -m dev.cuda.bench_cluster_launch -c 50257:corpus -c 65536:corpus -b cuda -b nv
