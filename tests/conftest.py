from __future__ import annotations

import gzip
import os
import shutil
import struct
from pathlib import Path

import numpy as np
import pytest
import torch

from linvit.models import ModelSpec, create_vit, save_model

# The suite runs in three processes on two cores (see LONGEST_FIRST below): torch computes on one
# thread in each. Its default, a thread per core in every process, oversubscribes the cores, and
# idle OpenMP threads spin: a fifth more CPU time for the same tests, measured side by side. (The
# workflow's jobs get their threads from the workflow: run.threads.)
torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _one_thread():
    """A test whose run sets its own thread count (run.threads) leaves the next one at one."""
    yield
    torch.set_num_threads(1)


# The Triton kernel tests run on a GPU, or on the CPU under Triton's interpreter, which has to be
# on before triton is first imported: test_kernels.py runs them in a process of their own.
_KERNELS_HERE = os.environ.get("TRITON_INTERPRET") == "1" or torch.cuda.is_available()
collect_ignore = [] if _KERNELS_HERE else ["ops/interpreted"]


@pytest.fixture(params=["cpp", "fused"])
def cpu_path(request, monkeypatch):
    """The torch backend's two CPU implementations: linvit's C++ kernels, and the PyTorch paths
    that run where they cannot be built. The kernels' cases fail, not skip, where a compiler
    exists and the kernels still do not load."""
    from linvit.ops import cpp_kernels

    if request.param == "fused":
        monkeypatch.setattr(cpp_kernels, "load", lambda: False)
    elif shutil.which(os.environ.get("CXX", "c++")) is None:
        pytest.skip("no C++ compiler to build linvit's CPU kernels")
    else:
        assert cpp_kernels.load(), cpp_kernels.status()
    return request.param


def write_idx(path: Path, array: np.ndarray) -> None:
    header = bytes([0, 0, 0x08, array.ndim]) + struct.pack(f">{array.ndim}I", *array.shape)
    with gzip.open(path, "wb") as f:
        f.write(header + array.astype(np.uint8).tobytes())


def synthetic_mnist(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """28x28 images whose class sets the brightness of a central square, plus noise: learnable in
    a few steps and unchanged by shifts and flips, so end-to-end tests can check that training
    does something."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 10, n)
    images = rng.integers(0, 25, (n, 28, 28))
    images[:, 6:22, 6:22] += (25 + 22 * labels)[:, None, None]
    return images.astype(np.uint8), labels.astype(np.uint8)


@pytest.fixture(scope="session")
def mnist_root(tmp_path_factory) -> Path:
    """A Fashion-MNIST-layout folder (IDX, gzipped) of synthetic data: 512 train / 256 test."""
    root = tmp_path_factory.mktemp("fmnist")
    for split, n, seed in (("train", 512, 0), ("t10k", 256, 1)):
        images, labels = synthetic_mnist(n, seed)
        write_idx(root / f"{split}-images-idx3-ubyte.gz", images)
        write_idx(root / f"{split}-labels-idx1-ubyte.gz", labels)
    return root


@pytest.fixture
def tiny_spec() -> ModelSpec:
    return ModelSpec("cpu96", "softmax", num_classes=10, img_size=28, in_chans=1)


def make_model(spec: ModelSpec, operator: str = "softmax", seed: int = 0):
    torch.manual_seed(seed)
    return create_vit(spec.with_operator(operator))


def perturb(model: torch.nn.Module, seed: int = 1) -> torch.nn.Module:
    """Give every tensor (norms and biases too) values no fresh init produces, like a trained
    net."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.state_dict().values():
            p.add_(0.05 * torch.randn(p.shape, generator=g))
    return model


@pytest.fixture(autouse=True)
def _cpu_without_bf16(monkeypatch):
    """In-process runs train in float32 on every host, as on a CPU without bf16 instructions:
    run.amp=auto would otherwise train in bf16 on some CI machines and not on others. Tests of
    bf16 say so by patching the checks back (tests/runs/test_runtime.py). Subprocesses (CLI and
    workflow tests) still decide by their host."""
    from linvit.runs.runtime import CPU_CHECKS
    for check in CPU_CHECKS.values():
        monkeypatch.setattr(torch.cpu, check, lambda: False, raising=False)


@pytest.fixture(autouse=True)
def _fresh_linvit_logging():
    """Each test starts like a fresh process: no linvit log handlers (a handler left by an earlier
    test would write to that test's captured, closed stderr)."""
    yield
    import logging

    logger = logging.getLogger("linvit")
    for handler in list(logger.handlers):
        logger.removeHandler(handler)
        handler.close()


@pytest.fixture(scope="session")
def backbone_ckpt(tmp_path_factory):
    """A linear-operator cpu96 student (28 px, grey) for the dense tasks' backbone."""
    torch.manual_seed(0)
    # perturbed, so that norms and biases differ from a fresh model's too
    model = perturb(create_vit(ModelSpec("cpu96", "linear", 10, 28, 1)))
    path = tmp_path_factory.mktemp("ckpt") / "student.safetensors"
    save_model(model, path)
    return path


# The suite runs in three processes on two cores (pytest-xdist, --dist loadfile: pyproject's
# addopts; the workflow tests spend much of their time waiting on jobs and on SLURM's status
# checks): a test file is one unit of work, so its module and session fixtures are made once. The
# longest files start first (the SLURM grid, the shared tiny grid, the two-axis grid, the toy
# paper grid, the other workflow runs), so that no process is left with a long one at the end.
# (xdist_group cannot split a file instead: xdist 3.8 marks groups in a node id field pytest 9.2
# no longer reads.)
LONGEST_FIRST = ("tests/workflow/test_slurm.py", "tests/workflow/test_snakemake.py",
                 "tests/workflow/test_snakemake_axes.py", "tests/workflow/test_paper_toy.py",
                 "tests/workflow/test_snakemake_alone.py")


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    def rank(item) -> int:
        path = item.nodeid.split("::")[0]
        return LONGEST_FIRST.index(path) if path in LONGEST_FIRST else len(LONGEST_FIRST)
    items.sort(key=rank)                       # stable: file order within each rank


def one_error_line(capsys, command: str) -> str:
    """The one line a refused command writes to stderr (no traceback), checked and returned."""
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith(f"linvit {command}: "), err
    assert "Traceback" not in err
    return lines[0]
