# Collection and reporting: records -> results.csv -> tables, figures -> report.md.
TABLES = grid.report_tables(config, CELLS)      # an axis of one value has no table


def in_report(path, caption, category, **labels):
    """An output that `snakemake --report` shows, captioned by workflow/report/<caption>.rst."""
    return report(path, caption=f"../report/{caption}.rst", category=category, labels=labels)


rule grid_document:
    output:
        OUT.grid,
    params:
        doc=json.dumps(grid.grid_document(config, CELLS), sort_keys=True, indent=1),
    run:
        from linvit.io import write_text

        write_text(output[0], params.doc)


rule collect:
    input:
        grid=OUT.grid,
        records=[j.output for j in PLAN.collected()],
        code=code("collect"),
    output:
        results=OUT.collected("results"),
        curves=OUT.collected("curves"),
        layers=OUT.collected("distill_layers"),
    log:
        OUT.log("collect"),
    params:
        out=OUT.root,
    shell:
        "{REPORT} collect --grid {input.grid:q} --out {params.out:q} {input.records:q}"
        " > {log:q} 2>&1"


rule tables:
    input:
        grid=OUT.grid,
        results=OUT.collected("results"),
        curves=OUT.collected("curves"),
        layers=OUT.collected("distill_layers"),
        code=code("tables"),
    output:
        [OUT.table(name, fmt) if fmt != "md" else
         in_report(OUT.table(name, fmt), "table", "Tables", table=name)
         for fmt in TABLE_FORMATS for name in TABLES],
    log:
        OUT.log("tables"),
    params:
        out=OUT.tables,
    shell:
        "{REPORT} tables --grid {input.grid:q} --results {input.results:q}"
        " --curves {input.curves:q} --layers {input.layers:q} --out {params.out:q}"
        " > {log:q} 2>&1"


rule figures:
    input:
        grid=OUT.grid,
        results=OUT.collected("results"),
        curves=OUT.collected("curves"),
        layers=OUT.collected("distill_layers"),
        code=code("figures"),
    output:
        [in_report(OUT.figure(name, "png"), "figure", "Figures", figure=name)
         for name in FIGURES],
        [OUT.figure(name, "pdf") for name in FIGURES],
    log:
        OUT.log("figures"),
    params:
        out=OUT.figures,
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
        in_report(OUT.figure("attention_maps", "png"), "attention_maps", "Figures",
                  figure="attention_maps"),
        OUT.figure("attention_maps", "pdf"),
    log:
        OUT.log("attention_figure"),
    params:
        # words, each quoted by {params.students:q}
        students=[word for j in MAPS[1:]
                  for word in ("--student-record", f"{j.wildcards['model']}={j.output}")],
        out=OUT.figure("attention_maps"),
    threads: 1
    shell:
        "{REPORT} attention --teacher-record {input.teacher:q} {params.students:q}"
        " --out {params.out:q} > {log:q} 2>&1"


rule report:
    input:
        grid=OUT.grid,
        results=OUT.collected("results"),
        tables=[OUT.table(name, "md") for name in TABLES],
        # the report links the figures: redrawing one does not change the report
        figures=ancient([OUT.figure(name, "png") for name in (*FIGURES, "attention_maps")]),
        bench=[j.output for j in PLAN.of("bench")],
        robustness=[OUT.section("robustness")] if grid.robustness_section(config) else [],
        dense=dense_jobs.dense_in_report(config, RESULTS),
        code=code("report"),
    output:
        in_report(OUT.report, "report_md", "Report", document="report.md"),
    log:
        OUT.log("report"),
    params:
        # words, each quoted by {params.bench:q}
        bench=lambda wc, input: ["--bench-record", *input.bench] if input.bench else [],
        robustness=lambda wc, input: (["--robustness-section", *input.robustness]
                                      if input.robustness else []),
        dense=lambda wc, input: ["--dense-section", *input.dense] if input.dense else [],
        tables=OUT.tables,
    shell:
        "{REPORT} report --grid {input.grid:q} --results {input.results:q} {params.bench:q}"
        " {params.robustness:q} {params.dense:q}"
        " --tables {params.tables:q} --figures {input.figures:q} --out {output:q} > {log:q} 2>&1"
