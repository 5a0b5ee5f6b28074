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

A program of a module that takes the ids alone (``shardkit.inference.export_program(module, keys,
None)``: an embedding collection, a managed-collision collection in eval mode, quantized or not)
takes ``values`` and ``lengths`` only (``--batch`` without ``dense``) and returns a tuple of
tensors (e.g. the pooled ``[B, sum(dims)]``; per feature, its rows and lengths); ``--out``
saves them as a list.
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


def input_sizes(path: str) -> tuple[int | None, int]:
    """(N dense features, or None for a program without them; F sparse features) of a
    `torch.export` program."""
    program = torch.export.load(path)
    given = {node.name: node.meta["val"] for node in program.graph.nodes
             if node.op == "placeholder" and node.name in {"dense", "values", "lengths"}}  # fmt: skip
    size = given["lengths"].shape[0]  # F * B, B symbolic
    features = int(size.node.expr.as_coeff_Mul()[0]) if isinstance(size, torch.SymInt) else size
    return (int(given["dense"].shape[1]) if "dense" in given else None), features


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
        inputs = tuple(batch[name] for name in ("dense", "values", "lengths") if name in batch)
    else:
        num_dense, num_features = 13, 26
        if not args.aoti:
            num_dense, num_features = input_sizes(args.model)
        lengths = torch.randint(0, 3, (num_features * 64,))
        inputs = (torch.zeros(int(lengths.sum()), dtype=torch.int64), lengths)
        if num_dense is not None:
            inputs = (torch.randn(64, num_dense), *inputs)
    with torch.inference_mode():
        output = serve(*inputs)
        start = time.perf_counter()
        for _ in range(args.repeat):
            serve(*inputs)
        per_call = (time.perf_counter() - start) / max(args.repeat, 1)
    if isinstance(output, torch.Tensor):
        print(f"logits {tuple(output.shape)}, first {output.flatten()[:4].tolist()}")
    else:  # a module of the ids alone: a tuple of tensors
        print("outputs", ", ".join(str(tuple(t.shape)) for t in output))
    size = f"batch of {inputs[0].shape[0]}" if len(inputs) == 3 else f"{len(inputs[-1])} bags"
    print(f"{per_call * 1e3:.2f} ms per {size}")
    print("shardkit imported:", "no" if sys.modules.get("shardkit") is None else "yes")
    if args.out:
        torch.save(output if isinstance(output, torch.Tensor) else list(output), args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
