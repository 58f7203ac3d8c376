# Collection and reporting: records -> results.csv -> tables, figures -> report.md.
TABLES = grid.report_tables(config, CELLS)      # an axis of one value has no table
FIGURES = ["accuracy_by_init", "time_to_accuracy", "distill_layers", "claims"]


def in_report(path, caption, category, **labels):
    """An output that `snakemake --report` shows, captioned by workflow/report/<caption>.rst."""
    return report(path, caption=f"../report/{caption}.rst", category=category, labels=labels)


rule grid_document:
    output:
        f"{RESULTS}/grid.json",
    params:
        doc=json.dumps(grid.grid_document(config, CELLS), sort_keys=True, indent=1),
    run:
        from linvit.io import write_text

        write_text(output[0], params.doc)


rule collect:
    input:
        grid=f"{RESULTS}/grid.json",
        records=[j.output for j in PLAN.collected()],
        code=code("collect"),
    output:
        results=f"{RESULTS}/results.csv",
        curves=f"{RESULTS}/curves.csv",
        layers=f"{RESULTS}/distill_layers.csv",
    log:
        f"{RESULTS}/logs/collect.log",
    params:
        out=RESULTS,
    shell:
        "{REPORT} collect --grid {input.grid:q} --out {params.out:q} {input.records:q}"
        " > {log:q} 2>&1"


rule tables:
    input:
        grid=f"{RESULTS}/grid.json",
        results=f"{RESULTS}/results.csv",
        curves=f"{RESULTS}/curves.csv",
        code=code("tables"),
    output:
        [f"{RESULTS}/tables/{name}.csv" for name in TABLES],
        [in_report(f"{RESULTS}/tables/{name}.md", "table", "Tables", table=name)
         for name in TABLES],
        [f"{RESULTS}/tables/{name}.tex" for name in TABLES],
    log:
        f"{RESULTS}/logs/tables.log",
    params:
        out=f"{RESULTS}/tables",
    shell:
        "{REPORT} tables --grid {input.grid:q} --results {input.results:q}"
        " --curves {input.curves:q} --out {params.out:q} > {log:q} 2>&1"


rule figures:
    input:
        grid=f"{RESULTS}/grid.json",
        results=f"{RESULTS}/results.csv",
        curves=f"{RESULTS}/curves.csv",
        layers=f"{RESULTS}/distill_layers.csv",
        code=code("figures"),
    output:
        [in_report(f"{RESULTS}/figures/{name}.png", "figure", "Figures", figure=name)
         for name in FIGURES],
        [f"{RESULTS}/figures/{name}.pdf" for name in FIGURES],
    log:
        f"{RESULTS}/logs/figures.log",
    params:
        out=f"{RESULTS}/figures",
    shell:
        "{REPORT} figures --grid {input.grid:q} --results {input.results:q}"
        " --curves {input.curves:q} --layers {input.layers:q} --out {params.out:q} > {log:q} 2>&1"


# The attention-map figure: one `linvit attention-maps` job per model drawn (the teacher of the
# first dataset, teacher and size, and each operator's student distilled with the main loss) stores its
# maps; the figure reads those files only.


MAPS = PLAN.of("maps")              # the teacher's, then each operator's distilled student's


rule attention_maps:
    input:
        job_inputs("maps"),
        code=job_code("maps"),
    output:
        record=pattern("maps"),
    log:
        pattern("maps", "log"),
    benchmark:
        pattern("maps", "benchmark")
    params:
        **job_params("maps"),
    threads: KINDS["maps"].threads
    resources:
        **RUN_RESOURCES,
    shell:
        RUN_AND_RECORD


rule attention_figure:
    input:
        teacher=MAPS[0].output,
        students=[j.output for j in MAPS[1:]],
        code=code("attention"),
    output:
        in_report(f"{RESULTS}/figures/attention_maps.png", "attention_maps", "Figures",
                  figure="attention_maps"),
        f"{RESULTS}/figures/attention_maps.pdf",
    log:
        f"{RESULTS}/logs/attention_figure.log",
    params:
        # words, each quoted by {params.students:q}
        students=[word for j in MAPS[1:]
                  for word in ("--student-record", f"{j.wildcards['model']}={j.output}")],
        out=f"{RESULTS}/figures/attention_maps",
    threads: 1
    shell:
        "{REPORT} attention --teacher-record {input.teacher:q} {params.students:q}"
        " --out {params.out:q} > {log:q} 2>&1"


rule report:
    input:
        grid=f"{RESULTS}/grid.json",
        results=f"{RESULTS}/results.csv",
        tables=[f"{RESULTS}/tables/{name}.md" for name in TABLES],
        # the report links the figures: redrawing one does not change the report
        figures=ancient([f"{RESULTS}/figures/{name}.png" for name in FIGURES + ["attention_maps"]]),
        bench=[j.output for j in PLAN.of("bench")],
        robustness=[f"{RESULTS}/robustness.md"] if grid.robustness_section(config) else [],
        dense=dense_jobs.dense_in_report(config, RESULTS),
        code=code("report"),
    output:
        in_report(f"{RESULTS}/report.md", "report_md", "Report", document="report.md"),
    log:
        f"{RESULTS}/logs/report.log",
    params:
        # words, each quoted by {params.bench:q}
        bench=lambda wc, input: ["--bench-record", *input.bench] if input.bench else [],
        robustness=lambda wc, input: (["--robustness-section", *input.robustness]
                                      if input.robustness else []),
        dense=lambda wc, input: ["--dense-section", *input.dense] if input.dense else [],
        tables=f"{RESULTS}/tables",
    shell:
        "{REPORT} report --grid {input.grid:q} --results {input.results:q} {params.bench:q}"
        " {params.robustness:q} {params.dense:q}"
        " --tables {params.tables:q} --figures {input.figures:q} --out {output:q} > {log:q} 2>&1"
