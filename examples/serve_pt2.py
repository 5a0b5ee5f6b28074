"""Serve the model ``shardkit export --format pt2`` wrote, in a process that imports only torch.

    shardkit train --checkpoint-dir runs/adult                          # train (2 ranks)
    shardkit export runs/adult model.pt2 --format pt2 --aoti            # + model-aoti.pt2
    python examples/serve_pt2.py model.pt2                              # the torch.export program
    python examples/serve_pt2.py model-aoti.pt2 --aoti                  # the AOTInductor package

The program takes plain tensors: ``dense [B, N]`` float32, ``values [n]`` int64 ids (every
feature's ids, feature after feature, bag after bag) and ``lengths [F * B]`` int64 ids per bag
(feature-major), and returns the logits ``[B, 1]``; ``shardkit export`` printed N and the
features. ``--batch batch.pt`` scores a ``torch.save``d dict of those three tensors (and
``--out`` saves the logits); without it, a random batch of row 0 ids (every table has a row 0)
shows the shapes. The batch size (one included) and the number of ids may be anything.
"""

from __future__ import annotations

import argparse
import sys
import time

import torch


def load(path: str, aoti: bool):
    """The callable ``(dense, values, lengths) -> logits`` in ``path``."""
    if aoti:
        return torch._inductor.aoti_load_package(path)
    return torch.export.load(path).module()


def input_sizes(path: str) -> tuple[int, int]:
    """(N dense features, F sparse features) of a `torch.export` program."""
    program = torch.export.load(path)
    dense, _, lengths = (node.meta["val"] for node in program.graph.nodes if node.op == "placeholder"
                         and node.name in {"dense", "values", "lengths"})  # fmt: skip
    return int(dense.shape[1]), int(lengths.shape[0] // dense.shape[0])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", help="the .pt2 file shardkit export --format pt2 wrote")
    parser.add_argument("--aoti", action="store_true", help="the file is an AOTInductor package")
    parser.add_argument("--batch", help="a torch.save'd dict of dense, values and lengths")
    parser.add_argument("--out", help="where to torch.save the logits")
    parser.add_argument("--repeat", type=int, default=20, help="timed calls")
    args = parser.parse_args(argv)
    serve = load(args.model, args.aoti)
    if args.batch:
        batch = torch.load(args.batch, weights_only=True)
        inputs = (batch["dense"], batch["values"], batch["lengths"])
    else:
        num_dense, num_features = 13, 26
        if not args.aoti:
            num_dense, num_features = input_sizes(args.model)
        lengths = torch.randint(0, 3, (num_features * 64,))
        inputs = (torch.randn(64, num_dense), torch.zeros(int(lengths.sum()), dtype=torch.int64),
                  lengths)  # fmt: skip
    with torch.inference_mode():
        logits = serve(*inputs)
        start = time.perf_counter()
        for _ in range(args.repeat):
            serve(*inputs)
        per_call = (time.perf_counter() - start) / max(args.repeat, 1)
    print(f"logits {tuple(logits.shape)}, first {logits.flatten()[:4].tolist()}")
    print(f"{per_call * 1e3:.2f} ms per batch of {inputs[0].shape[0]}")
    print("shardkit imported:", "no" if sys.modules.get("shardkit") is None else "yes")
    if args.out:
        torch.save(logits, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
