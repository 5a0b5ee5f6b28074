"""`BinaryCriteoUtils`: Criteo's TSV files to NumPy ``.npy`` files and back, as TorchRec does
(``torchrec.datasets.criteo.BinaryCriteoUtils``), on local files.

The layout (TorchRec's, so files made by either library load in the other): per day,
``day_<d>_dense.npy`` float32 ``[rows, 13]`` (``log(x - min + 2)``), ``day_<d>_sparse.npy`` int64
``[rows, 26]`` (the hexadecimal ids as integers; int32 after `shuffle`) and
``day_<d>_labels.npy`` int32 ``[rows, 1]``.
"""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path

import numpy as np

from shardkit.datasets._criteo_rows import (
    CAT_FEATURE_COUNT,
    DAYS,
    FREQUENCY_THRESHOLD,
    INT_FEATURE_COUNT,
    CriteoIterDataPipe,
)
from shardkit.datasets.utils import PATH_MANAGER_KEY

__all__ = ["BinaryCriteoUtils", "local"]

logger = logging.getLogger(__name__)


def local(path: str | Path) -> str:
    """``path`` if it is a local file path; a remote one is refused (TorchRec opens those with
    iopath, which shardkit does not use)."""
    if "://" in str(path):
        raise ValueError(
            f"{str(path)!r} is not a local path; TorchRec reads remote Criteo files through "
            "iopath's PathManager, which shardkit does not use: copy the files locally"
        )
    return str(path)


def _row(row: list[str], first: int) -> tuple[list[int], list[int]]:
    dense = [int(row[i] or "0") for i in range(first, first + INT_FEATURE_COUNT)]
    start = first + INT_FEATURE_COUNT
    sparse = [int(row[i] or "0", 16) for i in range(start, start + CAT_FEATURE_COUNT)]
    return dense, sparse


class BinaryCriteoUtils:
    """Static helpers over Criteo's ``.npy`` files (TorchRec's names and arguments;
    ``path_manager_key`` is accepted and unused)."""

    @staticmethod
    def tsv_to_npys(in_file: str, out_dense_file: str, out_sparse_file: str, out_labels_file: str,
                    dataset_name: str = "criteo_1tb",
                    path_manager_key: str = PATH_MANAGER_KEY) -> None:  # fmt: skip
        """One TSV file to its dense, sparse and labels ``.npy`` files (Kaggle's unlabelled test
        file gets label -1)."""
        unlabelled = dataset_name == "criteo_kaggle" and "test" in in_file
        first = 0 if unlabelled else 1

        def mapper(row: list[str]) -> tuple[list[int], list[int], int]:
            return (*_row(row, first), -1 if unlabelled else int(row[0] or "0"))

        dense, sparse, labels = [], [], []
        for row_dense, row_sparse, label in CriteoIterDataPipe([local(in_file)], row_mapper=mapper):
            dense.append(row_dense)
            sparse.append(row_sparse)
            labels.append(label)
        dense_np = np.array(dense, dtype=np.int32).reshape(-1, INT_FEATURE_COUNT)
        dense_np -= dense_np.min() - 2 if dense_np.size else 0
        arrays = {
            out_dense_file: np.log(dense_np, dtype=np.float32),
            out_sparse_file: np.array(sparse, dtype=np.int64).reshape(-1, CAT_FEATURE_COUNT),
            out_labels_file: np.array(labels, dtype=np.int32).reshape(-1, 1),
        }
        for path, array in arrays.items():
            np.save(local(path), array)

    @staticmethod
    def get_shape_from_npy(path: str, path_manager_key: str = PATH_MANAGER_KEY) -> tuple[int, ...]:
        """The array's shape, read from the file's header only."""
        with open(local(path), "rb") as f:
            np.lib.format.read_magic(f)
            shape, _, _ = np.lib.format.read_array_header_1_0(f)
        return shape

    @staticmethod
    def get_file_row_ranges_and_remainder(
        lengths: list[int], rank: int, world_size: int, start_row: int = 0,
        last_row: int | None = None,
    ) -> tuple[dict[int, tuple[int, int]], int]:  # fmt: skip
        """This rank's rows of files with ``lengths`` rows, as ``{file index: (first, last)}``
        (inclusive, file-local), and the remainder: rows ``[start_row, last_row]`` split into
        ``world_size`` contiguous parts, the first ``remainder`` ranks one row longer."""
        total = (sum(lengths) - start_row) if last_row is None else last_row - start_row + 1
        per_rank = np.full(world_size, total // world_size)
        remainder = total % world_size
        per_rank[:remainder] += 1
        bounds = np.cumsum([0, *per_rank])
        left, right = bounds[rank] + start_row, bounds[rank + 1] - 1 + start_row
        ranges, file_right = {}, -1
        for index, length in enumerate(lengths):
            file_left, file_right = file_right + 1, file_right + length
            if left <= file_right and right >= file_left:
                ranges[index] = (int(max(left, file_left) - file_left),
                                 int(min(right, file_right) - file_left))  # fmt: skip
        return ranges, int(remainder)

    @staticmethod
    def load_npy_range(fname: str, start_row: int, num_rows: int,
                       path_manager_key: str = PATH_MANAGER_KEY,
                       mmap_mode: bool = False) -> np.ndarray:  # fmt: skip
        """Rows ``[start_row, start_row + num_rows)`` of a 2-D ``.npy`` file, reading only them."""
        with open(local(fname), "rb") as f:
            np.lib.format.read_magic(f)
            shape, _, dtype = np.lib.format.read_array_header_1_0(f)
            if len(shape) != 2:
                raise ValueError(f"load_npy_range: {fname} has shape {shape}; it reads 2-D arrays")
            total_rows, row_size = shape
            if not 0 <= start_row < total_rows:
                raise ValueError(
                    f"load_npy_range: start_row ({start_row}) must be in [0, {total_rows - 1}]"
                )
            if start_row + num_rows > total_rows:
                raise ValueError(
                    f"load_npy_range: num_rows ({num_rows}) from start_row ({start_row}) passes "
                    f"the end of {fname} ({total_rows} rows)"
                )
            if mmap_mode:
                return np.load(fname, mmap_mode="r")[start_row : start_row + num_rows]
            f.seek(start_row * row_size * dtype.itemsize, os.SEEK_CUR)
            data = np.fromfile(f, dtype=dtype, count=num_rows * row_size)
        return data.reshape(num_rows, row_size)

    @staticmethod
    def sparse_to_contiguous(in_files: list[str], output_dir: str,
                             frequency_threshold: int = FREQUENCY_THRESHOLD,
                             columns: int = CAT_FEATURE_COUNT,
                             path_manager_key: str = PATH_MANAGER_KEY,
                             output_file_suffix: str = "_contig_freq.npy") -> None:  # fmt: skip
        """Renumber each sparse column's ids ``2, 3, ...`` in order of first appearance over all
        files; ids seen fewer than ``frequency_threshold`` times become 1. Writes
        ``<name><output_file_suffix>`` per input file into ``output_dir``."""
        features = {Path(f).name.split(".")[0]: np.load(local(f)).transpose() for f in in_files}
        for column in range(columns):
            counts: dict[int, int] = {}
            if frequency_threshold > 1:
                for array in features.values():
                    ids, numbers = np.unique(array[column], return_counts=True)
                    for i, n in zip(ids.tolist(), numbers.tolist()):
                        counts[i] = counts.get(i, 0) + n
            mapping: dict[int, int] = {}
            next_id = 2
            for array in features.values():
                for position, value in enumerate(array[column].tolist()):
                    if value not in mapping:
                        if frequency_threshold > 1 and counts[value] < frequency_threshold:
                            mapping[value] = 1
                        else:
                            mapping[value], next_id = next_id, next_id + 1
                    array[column][position] = mapping[value]
            logger.info("sparse_to_contiguous: column %d has %d ids", column, len(mapping))
        for name, array in features.items():
            np.save(os.path.join(local(output_dir), name + output_file_suffix), array.transpose())

    @staticmethod
    def shuffle(input_dir_labels_and_dense: str, input_dir_sparse: str, output_dir_shuffled: str,
                rows_per_day: dict[int, int], output_dir_full_set: str | None = None,
                days: int = DAYS, int_columns: int = INT_FEATURE_COUNT,
                sparse_columns: int = CAT_FEATURE_COUNT,
                path_manager_key: str = PATH_MANAGER_KEY, random_seed: int = 0) -> None:  # fmt: skip
        """Shuffle the rows of days ``0 .. days - 2`` together (``np.random.seed(random_seed)``)
        and write them back as days of the same sizes; copy the last day (validation) as is."""
        columns = int_columns + sparse_columns + 1
        full = np.zeros((sum(rows_per_day[d] for d in range(days - 1)), columns), np.float32)
        first = 0
        for day in range(days - 1):
            last = first + rows_per_day[day]
            full[first:last, :int_columns] = _day(input_dir_labels_and_dense, day, "dense")
            full[first:last, int_columns:-1] = _day(input_dir_sparse, day, "sparse")
            full[first:last, -1:] = _day(input_dir_labels_and_dense, day, "labels")
            first = last
        if output_dir_full_set is not None:
            np.save(os.path.join(local(output_dir_full_set), "full.npy"), full)
        np.random.seed(random_seed)
        np.random.shuffle(full)
        first = 0
        for day in range(days - 1):
            last = first + rows_per_day[day]
            out = os.path.join(local(output_dir_shuffled), f"day_{day}_")
            np.save(out + "dense.npy", full[first:last, :int_columns])
            np.save(out + "sparse.npy", full[first:last, int_columns:-1].astype(np.int32))
            np.save(out + "labels.npy", full[first:last, -1:].astype(np.int32))
            first = last
        for part, folder in (("sparse", input_dir_sparse), ("dense", input_dir_labels_and_dense),
                             ("labels", input_dir_labels_and_dense)):  # fmt: skip
            name = f"day_{days - 1}_{part}.npy"
            shutil.copyfile(os.path.join(folder, name), os.path.join(output_dir_shuffled, name))


def _day(folder: str, day: int, part: str) -> np.ndarray:
    return np.load(os.path.join(local(folder), f"day_{day}_{part}.npy"))
