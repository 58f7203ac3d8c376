# Collection and reporting: records -> results.csv -> tables, figures -> report.md.
TABLES = grid.report_tables(config, CELLS)      # an axis of one value has no table
FIGURES = ["accuracy_by_init", "time_to_accuracy", "distill_layers", "claims"]
FIRST = grid.attention_panel(config)   # (dataset, teacher, size) of the attention-map figure


def in_report(path, caption, category, **labels):
    """An output that `snakemake --report` shows, captioned by workflow/report/<caption>.rst."""
    return report(path, caption=f"../report/{caption}.rst", category=category, labels=labels)


def all_records():
    records = [f"{grid.teacher_dir(RESULTS, *t)}/record.json"
               for t in grid.teachers(config, CELLS)]
    records += [f"{grid.distill_dir(RESULTS, *k)}/record.json" for k in grid.distillations(CELLS)]
    return records + [f"{grid.cell_dir(RESULTS, c)}/record.json" for c in CELLS]


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
        records=all_records(),
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
        expand(f"{RESULTS}/tables/{{name}}.csv", name=TABLES),
        [in_report(f"{RESULTS}/tables/{name}.md", "table", "Tables", table=name)
         for name in TABLES],
        expand(f"{RESULTS}/tables/{{name}}.tex", name=TABLES),
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
        expand(f"{RESULTS}/figures/{{name}}.pdf", name=FIGURES),
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


def attention_students():
    """operator -> record.json of the maps job of its distilled student."""
    return {m: f"{grid.maps_dir(RESULTS, *FIRST, m)}/record.json"
            for m in grid.attention_models(config, CELLS) if m != grid.MAPS_TEACHER}


def maps_student(wc):
    """The distillation whose student the job maps, or None for the teacher's own maps."""
    if wc.model == grid.MAPS_TEACHER:
        return None
    return grid.distill_dir(RESULTS, wc.dataset, wc.teacher, wc.size, wc.model,
                            config["main_loss"])


def maps_args(wc):
    student = maps_student(wc)
    return grid.maps_args(config, wc.dataset, f"{teacher_dir(wc)}/model.safetensors",
                          f"{student}/model.safetensors" if student else None,
                          grid.maps_dir(RESULTS, wc.dataset, wc.teacher, wc.size, wc.model))


rule attention_maps:
    input:
        teacher=lambda wc: f"{teacher_dir(wc)}/record.json",
        distilled=lambda wc: [f"{maps_student(wc)}/record.json"] if maps_student(wc) else [],
        code=lambda wc: code("attention-maps",
                             ["softmax"] + ([wc.model] if maps_student(wc) else []), [],
                             [registry_dataset(wc.dataset)]),
    output:
        record=f"{RESULTS}/maps/{{dataset}}/{{teacher}}/{{size}}/{{model}}/record.json",
    log:
        f"{RESULTS}/logs/maps/{{dataset}}/{{teacher}}/{{size}}/{{model}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/maps/{{dataset}}/{{teacher}}/{{size}}/{{model}}.tsv"
    wildcard_constraints:
        model="[^/]+",
    params:
        kind="maps",
        dir=lambda wc: grid.maps_dir(RESULTS, wc.dataset, wc.teacher, wc.size, wc.model),
        key=lambda wc: json.dumps({"dataset": wc.dataset, "teacher": wc.teacher,
                                   "size": wc.size,
                                   "operator": "softmax" if wc.model == grid.MAPS_TEACHER
                                   else wc.model,
                                   "model": "teacher" if wc.model == grid.MAPS_TEACHER
                                   else "distilled"}),
        args=maps_args,
    threads: 1
    resources:
        **RUN_RESOURCES,
    shell:
        RUN_AND_RECORD


rule attention_figure:
    input:
        teacher=f"{grid.maps_dir(RESULTS, *FIRST, grid.MAPS_TEACHER)}/record.json",
        students=list(attention_students().values()),
        code=code("attention"),
    output:
        in_report(f"{RESULTS}/figures/attention_maps.png", "attention_maps", "Figures",
                  figure="attention_maps"),
        f"{RESULTS}/figures/attention_maps.pdf",
    log:
        f"{RESULTS}/logs/attention_figure.log",
    params:
        # words, each quoted by {params.students:q}
        students=[word for op, path in attention_students().items()
                  for word in ("--student-record", f"{op}={path}")],
        out=f"{RESULTS}/figures/attention_maps",
    threads: 1
    shell:
        "{REPORT} attention --teacher-record {input.teacher:q} {params.students:q}"
        " --out {params.out:q} > {log:q} 2>&1"


rule report:
    input:
        grid=f"{RESULTS}/grid.json",
        results=f"{RESULTS}/results.csv",
        tables=expand(f"{RESULTS}/tables/{{name}}.md", name=TABLES),
        # the report links the figures: redrawing one does not change the report
        figures=ancient(expand(f"{RESULTS}/figures/{{name}}.png",
                               name=FIGURES + ["attention_maps"])),
        bench=[f"{RESULTS}/bench/record.json"] if config.get("bench") else [],
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
