# The operator benchmark (`linvit bench`, part of `all` when config has a `bench` section): time and
# peak memory against tokens, model throughput against resolution; a section of report.md.


rule bench:
    input:
        code=job_code("bench"),
    output:
        record=pattern("bench"),
    log:
        pattern("bench", "log"),
    params:
        **job_params("bench"),
    # Every core of the machine it runs on (KINDS["bench"]): timings must not share the machine
    # with other jobs. Locally Snakemake caps it at --cores; a cluster run has no such total, so
    # it must not be asked for.
    threads: KINDS["bench"].threads
    resources:
        **RUN_RESOURCES,
    shell:
        RUN_AND_RECORD
