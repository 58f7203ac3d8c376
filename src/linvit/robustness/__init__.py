"""Robustness under distribution shift: ImageNet-C-style corruptions made on the fly
(corruptions.py), ImageNet-A/R/Sketch/V2 read from folders (shifts.py), and the `corrupt` and
`robustness` stages (stages.py)."""
