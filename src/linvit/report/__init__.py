"""Collection, tables, figures and the report. Reads results files only: records, CSVs and the
attention maps that `linvit attention-maps` jobs store; no model or data code."""
