"""The kinds of job record (`record --kind`): what made a record.json. "import" (timm weights a
probe job then gives a head), "maps" (attention maps for the figure), "corrupt" and "robustness"
never reach collection (what reads them is a later job or their own report step); "selection"
(a candidate fine-tuning setting scored on the validation split) is collected beside the cells.
Alone in this module so that the report CLI names its choices without importing a step."""
KINDS = ("teacher", "import", "distill", "cell", "dense", "bench", "maps", "corrupt", "robustness",
         "selection")
