"""Collection, tables, figures and the report. Reads results files only; only the attention-map
figure loads models."""
