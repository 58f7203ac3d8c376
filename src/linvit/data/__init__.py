"""The dataset registry. Adding a dataset: one file here, one line in DATASETS."""
from __future__ import annotations

from linvit.data.base import DataInfo
from linvit.data.cifar import CIFAR
from linvit.data.fashion_mnist import FashionMNIST
from linvit.data.imagefolder import ImageFolderDataset
from linvit.data.mnist5k import MNIST5k
from linvit.registry import Registry

DATASETS = Registry("dataset", {
    "fashion_mnist": FashionMNIST(),
    "mnist5k": MNIST5k(),
    "cifar10": CIFAR(10),
    "cifar100": CIFAR(100),
    "imagefolder": ImageFolderDataset(),
})
get_dataset = DATASETS.lookup


__all__ = ["DATASETS", "DataInfo", "get_dataset"]
