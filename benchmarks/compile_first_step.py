"""How long the compiled TTT objective's first step takes, and torch's account of it (compile_report).

Why: on the H200 a compiled training run's first step takes 56-70 s even with the compile caches restored
(2026-12-04). The draft's graphs do not depend on the target's size, so the tiny target shows what compiling
them costs here; run it twice, the second time with the caches the first one wrote:

  TORCHINDUCTOR_CACHE_DIR=/tmp/ind TRITON_CACHE_DIR=/tmp/tri python3 benchmarks/compile_first_step.py [--device cuda]

On the GPU machine after a call of ops/gpu/*.sh has set it up (a bare python3 there has neither draftlab on its
path nor the embedded target's package: 2026-12-04), with that call's environment: the values below are
ops.gpu_call.Call.environ's for the default folders (DL=/tmp/dl, SITE=/tmp/site), which is their one
definition:

  PYTHONPATH=$PWD/lib:/tmp/site DRAFTLAB_CACHE=/tmp/dl/cache DRAFTLAB_EMBEDDED_GGUF=/tmp/dl/model.gguf \
  TRITON_CACHE_DIR=/tmp/dl/compile-cache/triton TORCHINDUCTOR_CACHE_DIR=/tmp/dl/compile-cache/inductor \
  python3 benchmarks/compile_first_step.py --device cuda
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F

from draftlab.model.draft import Eagle3Draft, draft_config_for_target
from draftlab.model.hidden import target_states
from draftlab.model.target import autocast, load_target
from draftlab.train_draft import TTTObjective, targets_at
from draftlab.train_draft.objective import compile_report


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--ttt-steps", type=int, default=7)
    args = ap.parse_args()
    target = load_target("tiny", device=args.device)
    cfg = draft_config_for_target(target.config, draft_vocab_size=512, use_aux=True)
    draft = Eagle3Draft(cfg, target.model.get_input_embeddings()).to(args.device)
    draft.set_vocab(torch.arange(0, 1024, 2, device=args.device))
    objective = TTTObjective(draft, args.ttt_steps, 0.8, compile=True)
    for step, (b, seq) in enumerate(((3, 24), (2, 30), (4, 40))):  # batches of differing shapes, as in training
        ids = torch.randint(3, target.vocab_size, (b, seq), device=args.device)
        valid = torch.ones(b, seq, dtype=torch.bool, device=args.device)
        aux, last, _ = target_states(target, ids, valid.long(), target.capture_layers)
        targets = targets_at(target, last, F.pad(valid[:, 1:], (0, 1)), draft.draft_ids(), draft.t2d)
        t = time.time()
        with autocast(args.device):  # bf16 on CUDA, as training runs it
            loss, _ = objective(aux, ids, valid, targets)
        loss.backward()
        if args.device == "cuda":
            torch.cuda.synchronize()
        print(f"step {step} (B {b} x T {seq}): {time.time() - t:.1f} s", flush=True)
    print(compile_report(12))


if __name__ == "__main__":
    main()
