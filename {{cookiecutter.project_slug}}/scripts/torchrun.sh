#!/usr/bin/env bash
# Run the CLI under torchrun (torch.distributed.elastic), on one node or several.
#
#   scripts/torchrun.sh [options] [-- subcommand and CLI flags]      (default subcommand: fit)
#
#   --nnodes N          nodes in the job (default 1)
#   --node-rank R       this node's rank, 0 .. N-1 (default 0); start the same
#                       command on every node, each with its own rank
#   --nproc-per-node G  processes on this node, one per GPU (default: the GPUs
#                       nvidia-smi lists, else 1)
#   --master-addr HOST  address of node 0, reachable from every node (default 127.0.0.1)
#   --master-port PORT  a free port on node 0 (default 29500)
#   --max-restarts N    times torchrun starts the workers again after one fails (default 3)
#
# One node, every GPU:   scripts/torchrun.sh
# Two nodes, 8 GPUs each:
#   node 0: scripts/torchrun.sh --nnodes 2 --node-rank 0 --nproc-per-node 8 --master-addr 10.0.0.1
#   node 1: scripts/torchrun.sh --nnodes 2 --node-rank 1 --nproc-per-node 8 --master-addr 10.0.0.1
#
# The trainer is told the same counts torchrun starts (--trainer.devices =
# --nproc-per-node, --trainer.num_nodes = --nnodes), so they cannot disagree.
# When a worker dies (killed, out of memory, a lost GPU), torchrun stops the
# others and starts them all again, up to --max-restarts times: the fit then
# continues its run from its newest checkpoint by itself (save mid-epoch with
# --checkpoint.every_n_train_steps N to lose at most N steps). To start a
# stopped job again yourself, add `-- fit --ckpt_path last`.
set -euo pipefail

nnodes=1
node_rank=0
nproc_per_node=""
master_addr=127.0.0.1
master_port=29500
max_restarts=3

usage() { sed -n '2,/^set /{/^#/p}' "$0" | sed 's/^# \{0,1\}//'; }

while [[ $# -gt 0 ]]; do
  case "$1" in
    --nnodes) nnodes="$2"; shift 2 ;;
    --node-rank) node_rank="$2"; shift 2 ;;
    --nproc-per-node) nproc_per_node="$2"; shift 2 ;;
    --master-addr) master_addr="$2"; shift 2 ;;
    --master-port) master_port="$2"; shift 2 ;;
    --max-restarts) max_restarts="$2"; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    --) shift; break ;;
    *) echo "torchrun.sh: unknown option '$1' (scripts/torchrun.sh --help)" >&2; exit 2 ;;
  esac
done

if [[ -z "$nproc_per_node" ]]; then
  nproc_per_node=$(nvidia-smi --list-gpus 2>/dev/null | grep -c '^GPU' || true)
  [[ "$nproc_per_node" -ge 1 ]] || nproc_per_node=1
fi
for name in nnodes node_rank nproc_per_node master_port max_restarts; do
  if ! [[ "${!name}" =~ ^[0-9]+$ ]]; then
    echo "torchrun.sh: --${name//_/-} '${!name}' must be a whole number" >&2; exit 2
  fi
done
if (( node_rank >= nnodes )); then
  echo "torchrun.sh: --node-rank $node_rank must be less than --nnodes $nnodes" >&2; exit 2
fi

[[ $# -gt 0 ]] || set -- fit
subcommand="$1"
shift
# DDP unless the flags say otherwise; the counts always from the launch.
# The c10d rendezvous, hosted on node 0's address and port, and each start of the
# workers with a store of its own: a group restarted on a store it shares with
# the last one (torchrun's default) may read the addresses its dead workers
# listened on, and fail to connect again.
export TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1
exec torchrun \
  --nnodes="$nnodes" \
  --node_rank="$node_rank" \
  --nproc_per_node="$nproc_per_node" \
  --rdzv_backend=c10d \
  --rdzv_endpoint="$master_addr:$master_port" \
  --rdzv_id="{{ cookiecutter.project_slug }}-$master_port" \
  --max_restarts="$max_restarts" \
  -m {{ cookiecutter.package_name }} "$subcommand" \
  --trainer.strategy=ddp \
  "$@" \
  --trainer.devices="$nproc_per_node" \
  --trainer.num_nodes="$nnodes"
