# The operator benchmark (`linvit bench`, part of `all` when config has a `bench` section): time and
# peak memory against tokens, model throughput against resolution; a section of report.md.
BENCH = f"{RESULTS}/bench"


rule bench:
    input:
        code=code("bench", (config.get("bench") or {}).get("operators",
                                                     deps.registry_names("operator"))),
    output:
        record=f"{BENCH}/record.json",
    log:
        f"{RESULTS}/logs/bench.log",
    params:
        kind="bench",
        dir=f"{BENCH}/run",
        key=json.dumps({"stage": "bench"}),
        args=grid.bench_args(config, f"{BENCH}/run"),
    # Every core of the machine it runs on, counted there (the Snakefile is read again inside a
    # cluster job): timings must not share the machine with other jobs. Locally Snakemake caps
    # it at --cores; a cluster run has no such total, so it must not be asked for.
    threads: os.cpu_count() or 1
    resources:
        **RUN_RESOURCES,
    shell:
        RUN_AND_RECORD
