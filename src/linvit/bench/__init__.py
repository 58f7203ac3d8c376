"""`linvit bench`: how operators scale with tokens and models with resolution.

    measure.py    median wall time (torch.utils.benchmark) and peak memory of one call
    operators.py  every operator's token mixing, forward+backward, against tokens
    models.py     whole-model inference throughput against image resolution
    ratios.py     speedups over softmax measured in the same run, memory slopes, the goals
    figures.py    the plots
    stage.py      the entry point: CSVs, ratios.md, figures, metrics.json in one folder
"""
