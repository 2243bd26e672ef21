#!/bin/bash
# One device run of the cluster kernel variants (dev/cuda/bench_cluster.py), then the
# shipped cluster kernels through the plan (dev/cuda/bench_cluster_launch.py).
export PYTHONPATH=src:.
B="python3 -m dev.cuda.bench_cluster -r 2"
set -x
$B -V 50257 --mode corpus
$B -V 50257 --mode corpus --threads 544 --no-check
$B -V 50257 --mode hard --threads 544 --no-check
$B -V 50257 --mode hard --threads 544 -D CLUSTER_PIPELINED_FOLD=1 --no-check
$B -V 65536 --mode corpus --no-check
$B -V 65536 --mode corpus --held-weights --no-check
$B -V 65536 --mode hard --threads 544 --no-check
python3 -m dev.cuda.bench_cluster_launch -c 50257:corpus -c 65536:corpus -b cuda -b nv
