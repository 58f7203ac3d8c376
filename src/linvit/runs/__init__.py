"""Run folders, runtime set-up and completion checks: what every stage (train, transfer, dense,
bench) shares, so that no stage reaches into another for them."""
