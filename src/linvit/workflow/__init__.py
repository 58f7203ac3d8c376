"""What only the Snakemake workflow uses: the grid and its jobs (grid), the config check (check),
the code-dependency map and stamps (deps), what a start reuses (memo) and the cluster profile's
checks (cluster). No stage imports this package; it imports the core and the registries."""
