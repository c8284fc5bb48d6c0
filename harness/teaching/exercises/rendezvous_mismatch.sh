#!/bin/sh
# Start the job's two nodes as each machine starts its own: one torchrun agent per node,
# one rank each, meeting at node 0's address.
ADDR=127.0.0.1
PORT=${PORT:-29400}

start_node() {
    # a new rendezvous id for each run, so that a rerun at this address starts afresh
    torchrun --nnodes 2 --nproc-per-node 1 --rdzv-backend c10d \
        --rdzv-endpoint "$ADDR:$PORT" --rdzv-id "run-$(date +%s%N)" train.py
}

start_node &  # node 0
start_node    # node 1
wait
