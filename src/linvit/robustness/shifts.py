"""ImageNet distribution-shift test sets, read from folders: which image has which label, and
which of a 1000-class model's logits a set is scored on.

- imagenet_a, imagenet_r: 200-class subsets (wnid folders). A 1000-class model is scored on
  logits[:, indices] with timm's index and synset files (timm/data/_info/imagenet_{a,r}_*.txt),
  a folder's label being its wnid's position in the synset list.
- imagenet_sketch: 1000 wnid folders, the standard ImageNet labels (timm's imagenet_synsets.txt).
- imagenet_v2: folders named 0..999 by class index. Labels are int(name): torchvision's
  ImageFolder sorts names as strings (0, 1, 10, 100, ...) and would mislabel them.
Adding a set: one ShiftSet in SHIFTS.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from linvit.data.imagefolder import IMAGE_SUFFIXES
from linvit.errors import DatasetNotFound
from linvit.registry import Registry

IMAGENET_CLASSES = 1000


def _timm_info(name: str) -> list[str]:
    from importlib.resources import files

    return (files("timm.data") / "_info" / name).read_text().split()


@dataclass(frozen=True)
class ShiftSet:
    title: str
    subset: str | None          # timm's name of the class subset (a, r), None: all 1000
    by_index: bool = False      # folders named by class index (ImageNet-V2)

    def class_indices(self) -> list[int] | None:
        """The 1000-class logits the set is scored on, in label order; None: all of them."""
        if self.subset is None:
            return None
        return [int(i) for i in _timm_info(f"imagenet_{self.subset}_indices.txt")]

    def label_of(self) -> dict[str, int]:
        """Folder name -> label (an index into the scored logits)."""
        if self.by_index:
            return {str(i): i for i in range(IMAGENET_CLASSES)}
        synsets = _timm_info(f"imagenet_{self.subset}_synsets.txt" if self.subset
                             else "imagenet_synsets.txt")
        return {wnid: i for i, wnid in enumerate(synsets)}

    def samples(self, root: str | Path, partial: bool = False) -> list[tuple[Path, int]]:
        """(image, label) of every image under root/<class folder>/, in a fixed order; unknown
        class folders are an error (a wrong root must not score as a shift), and so is a set
        with images of fewer than all its classes unless `partial` (then its score is reported
        as partial: `coverage`)."""
        root = Path(root)
        if not root.is_dir():
            raise DatasetNotFound(f"{self.title}: folder not found: {root}")
        labels = self.label_of()
        folders = [p for p in root.iterdir() if p.is_dir()]
        unknown = sorted(p.name for p in folders if p.name not in labels)
        if unknown:
            raise DatasetNotFound(f"{self.title} at {root}: {len(unknown)} class folders are not "
                                  f"classes of the set, e.g. {unknown[0]!r}")
        out = [(f, labels[d.name]) for d in sorted(folders, key=lambda p: labels[p.name])
               for f in sorted(d.iterdir()) if f.suffix.lower() in IMAGE_SUFFIXES]
        if not out:
            raise DatasetNotFound(f"{self.title}: no images under {root}")
        have, of = self.coverage(out)
        if have < of and not partial:
            raise DatasetNotFound(f"{self.title} at {root}: images of {have} of its {of} "
                                  "classes; a score on part of the set would pass for the set's "
                                  "(robustness `partial_shifts: true` scores it as partial)")
        return out

    def coverage(self, samples: list[tuple[Path, int]]) -> tuple[int, int]:
        """(classes with an image among `samples`, classes of the set)."""
        return len({label for _, label in samples}), len(set(self.label_of().values()))


SHIFTS = Registry("shift set", {
    "imagenet_a": ShiftSet("ImageNet-A", "a"),
    "imagenet_r": ShiftSet("ImageNet-R", "r"),
    "imagenet_sketch": ShiftSet("ImageNet-Sketch", None),
    "imagenet_v2": ShiftSet("ImageNet-V2", None, by_index=True),
})


class ShiftDataset:
    """A torch Dataset of a shift set's images through an evaluation transform."""

    def __init__(self, samples: list[tuple[Path, int]], transform):
        self.items, self.transform = samples, transform

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int):
        from linvit.data.imagefolder import open_image

        path, label = self.items[i]
        return self.transform(open_image(path)), label
