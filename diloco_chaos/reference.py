"""The reference pages of docs/reference/, generated from the code.

`pages()` returns every page (file name -> Markdown); `python -m diloco_chaos.reference`
writes them into docs/reference/, and `--check` only compares (exit 1, naming each stale
page): a checkout-only tool (an install has no docs/; `--out` names another folder).
suites/unit/test_reference_docs.py holds the committed pages equal to `pages()`,
so a fault kind, a check, a scenario key or an option added in the code without its page
regenerated fails the tests.

What each page reads: the fault kinds' classes (`FAULT_KINDS`), the checks' functions
and the planted-bug catalogue, the event kinds (the writer's `trainer.events.EVENT_KINDS`),
the summary's keys (`Metrics` and `SUMMARY_KEYS` below), the scenario's dataclasses, and
the command line's parser.
"""
from __future__ import annotations

import argparse
import dataclasses
import inspect
import re
import sys
from importlib import resources
from pathlib import Path
from typing import Any

# every event kind of events.jsonl, with who writes it and what a line says: declared once,
# beside the writer that refuses any other kind
from diloco_chaos.trainer.units.events import EVENT_KINDS

REFERENCE_DIR = Path(resources.files("diloco_chaos")).resolve().parent / "docs" / "reference"  # in a checkout
REGENERATE = "python -m diloco_chaos.reference"


# ------------------------------------------------------------------ small helpers
def first_sentence(doc: str | None) -> str:
    """The first sentence of a docstring, on one line."""
    text = " ".join((doc or "").split())
    parts = re.split(r"(?<=[.!?])\s+(?=[A-Z(`])", text, maxsplit=1)
    return parts[0] if parts else ""


def cell(text: Any) -> str:
    """Text safe inside a Markdown table cell."""
    return str(text).replace("|", "\\|").replace("\n", " ")


def table(header: tuple[str, ...], rows: list[tuple]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def toml_value(value: Any) -> str:
    """A default as a scenario file writes it."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return f'"{value}"'
    if isinstance(value, (tuple, list)):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    return f"{value:g}" if isinstance(value, float) else str(value)


def written_name(name: str) -> str:
    """How a field is written in a scenario file: `at_s` as `at` (or `at_s`)."""
    return name[:-2] if name.endswith("_s") else name


def field_comments(cls: type) -> dict[str, str]:
    """Each dataclass field's comment in the source: the one on its line, else the comment
    lines just above it."""
    try:
        lines = inspect.getsource(cls).splitlines()
    except (OSError, TypeError):
        return {}
    out: dict[str, str] = {}
    above: list[str] = []
    for line in lines:
        stripped = line.strip()
        if stripped.startswith("#"):
            above.append(stripped.lstrip("# ").strip())
            continue
        m = re.match(r"\s+(\w+): [^=#]+(?:=[^#]*)?(?:#\s*(.*))?$", line)
        if m and not stripped.startswith(("def ", "@")):
            comment = m.group(2) or " ".join(above)
            if comment:
                out[m.group(1)] = comment.strip()
        above = []
    return out


def default_of(f: dataclasses.Field) -> tuple[bool, Any]:
    """(required, default) of a dataclass field."""
    if f.default is not dataclasses.MISSING:
        return False, f.default
    if f.default_factory is not dataclasses.MISSING:
        return False, f.default_factory()
    return True, None


def shown_default(f: dataclasses.Field, unset: str = "unset") -> str:
    required, value = default_of(f)
    if required:
        return "required"
    if value is None:
        word = f.metadata.get("none_word")
        return f'"{word}"' if word else unset
    return toml_value(value)


# ------------------------------------------------------------------ fault kinds
COMMON_FAULT_FIELDS = ("target", "at_s")


def fault_kinds() -> list[dict]:
    """Every fault kind in FAULT_KINDS order: its target form, length field, parameters
    (fields besides target and at), how it is done on processes and in the simulator, and
    its docstring's first sentence."""
    from diloco_chaos.faults.kinds import FAULT_KINDS

    out = []
    for kind, cls in FAULT_KINDS.items():
        comments = field_comments(cls)
        params = []
        for f in dataclasses.fields(cls):
            if f.name in COMMON_FAULT_FIELDS:
                continue
            required, default = default_of(f)
            params.append({"name": written_name(f.name), "field": f.name, "type": str(f.type),
                           "required": required, "default": None if required else shown_default(f),
                           "note": comments.get(f.name, "")})
        # `role`: one word where the kind has one role (as `faults --json` has always said), else a list
        out.append({"kind": kind, "role": cls.roles[0] if len(cls.roles) == 1 else list(cls.roles),
                    "target": cls.target_forms(),
                    "length": written_name(cls.length_field), "parameters": params,
                    "mechanism": mechanism_on_processes(kind), "simulator": mechanism_in_simulator(kind),
                    "description": first_sentence(cls.__doc__)})
    return out


def mechanism_on_processes(kind: str) -> str:
    from diloco_chaos.harness.run.control import LOCAL_MECHANISMS, mechanism_words

    return mechanism_words(LOCAL_MECHANISMS, kind)


def mechanism_in_simulator(kind: str) -> str:
    """The simulator's words for a kind (its `World.mechanism` reads no state of the world)."""
    from diloco_chaos.harness.sim.world import World

    try:
        return World.mechanism(None, kind)
    except AttributeError:  # the method came to read the world: no words without one
        return ""


def fault_kinds_page() -> str:
    rows = []
    for k in fault_kinds():
        params = "; ".join(f"`{p['name']}` ({p['type']}, {'required' if p['required'] else p['default']})"
                           for p in k["parameters"]) or "-"
        rows.append((f"`{k['kind']}`", k["target"], params, k["mechanism"], k["simulator"], k["description"]))
    notes = []
    for k in fault_kinds():
        for p in k["parameters"]:
            if p["note"]:
                notes.append((f"`{k['kind']}`", f"`{p['name']}`", p["note"]))
    return "\n\n".join([
        _generated("Fault kinds"),
        "Every `[[faults]]` table takes `kind`, `target` and `at` (seconds from time zero, when every "
        "learner has made its first inner step), and the parameters of its kind below. Times are "
        "seconds (`\"15s\"`, `\"500ms\"`, `\"2m\"` or a number); a field written `x` may also be "
        "written `x_s`. A length of `\"never\"` (kill_unit, kill_syncer) means the unit does not "
        "come back; `\"end\"` (wan) means to the end of the run.",
        table(("kind", "target", "parameters (type, default)", "on processes", "in the simulator",
               "what it does"), rows),
        "## Parameter notes\n\n" + (table(("kind", "parameter", "note"), notes) if notes else "None."),
        "`diloco-chaos faults` prints the same list (`--json` for tools).",
    ]) + "\n"


# ------------------------------------------------------------------ checks
PROPERTY_CHECKS = {  # checks the property suites judge (suites/properties/sim_props.py), not a run's verdict
    "fetched_before_contributing": "A rejoining learner fetches Θ[p] before it contributes p.",
}


def check_table() -> list[dict]:
    """Every check a run's verdict, a scenario's [expect] or a property suite judges: its
    name, where it is judged, what it holds, its bound, and the evidence it reads as the
    planted-bug catalogue records it."""
    from diloco_chaos.harness.judging import audits, baseline, checks, inner_steps, ledger, model_checks, storage
    from diloco_chaos.harness.judging.planted import CATALOGUE, PROOFS

    safety = {
        "merged_at_most_once": (checks.merged_at_most_once, "0 violations"),
        "progress_merged_once": (model_checks.progress_merged_once, "0 violations"),
        "delta_bases_advance": (model_checks.delta_bases_advance, "0 violations"),
        "versions_monotonic": (checks.versions_monotonic, "0 violations"),
        "no_nan": (checks.no_nan, "0 violations"),
        "durable_rounds_kept": (checks.durable_rounds_kept, "0 violations"),
        "no_global_downtime": (checks.no_global_downtime,
                               "no commit gap over the uptime gap bound (summary `commit_gap_bound_s`, "
                               "scaled by the run's pace) while a quorum was reachable"),
        "global_loss_regression": (model_checks.global_loss_regression,
                                   f"a rise ≤ {model_checks.RISE_MAX} nats over the best so far; the end "
                                   f"≤ {model_checks.END_MAX} nats over the best"),
        "link_buffers_bounded": (model_checks.link_buffers_bounded,
                                 f"what the kernel and proxy hold ({model_checks.HELD_BYTES} bytes) plus "
                                 "one whole frame per key that can wait"),
        "tokens_conserved": (ledger.tokens_conserved, "0 violations"),
        "weights_match_staleness": (audits.weights_match_staleness, "0 violations (relative 1e-9)"),
        "quorum_respected": (audits.quorum_respected, "0 rounds under K"),
        "grace_respected": (audits.grace_respected, "0 early rounds without every live, not closed learner"),
        "commits_audited": (audits.commits_audited,
                            f"0 violations (a step within {audits.STEP_RTOL:g} of the judge's, relative, "
                            f"plus {audits.THETA_RTOL:g} of Θ[p])"),
        "copies_consistent": (audits.copies_consistent, "0 violations (digests equal)"),
        "progress_staleness_bounded": (audits.progress_staleness_bounded,
                                       "2 × max_staleness versions between the copy a merged Δ's oldest step "
                                       "was made on and the version it merged into"),
        "deltas_reexecuted": (audits.deltas_reexecuted,
                              f"0 violations (a Δ within {audits.DELTA_RTOL:g} of its steps' sum, relative, "
                              f"plus {audits.DELTA_ATOL:g} of Θ[p]; its claim exactly its steps and tokens)"),
        "inner_steps_reexecuted": (inner_steps.inner_steps_reexecuted,
                                   f"0 violations (θ, m, v after a step within {inner_steps.RTOL:g} of what the "
                                   f"step changed plus {inner_steps.ATOL:g} of the value; counts exact)"),
        "guard_decisions": (audits.guard_decisions, "0 violations"),
        "restores_faithful": (audits.restores_faithful, "0 violations"),
        "membership_follows_links": (audits.membership_follows_links, "0 violations"),
        "starved_learners_reanchor": (audits.starved_learners_reanchor,
                                      f"a Hello within starve_cycles (×2 after an unanswered one) + "
                                      f"{audits.STARVE_SLACK_CYCLES} fragment cycles of silence"),
        "checkpoint_integrity": (storage.checkpoint_integrity, "0 violations"),
        "restore_latest_intact": (storage.restore_latest_intact, "0 violations"),
        "staleness_bounded": (model_checks.staleness_bounded,
                              "`max_staleness`, where a caller gives one (the property suites)"),
        "no_crash": (checks.no_crash, "0 crashes (judged when the log's header records crashes)"),
        "baseline_parity_max": (baseline.check,
                                f"[expect] loss_parity_max, else {baseline.BOUND:g} (a fraction of the baseline)"),
    }
    expect_docs = {name: fn.__doc__ for name, fn in checks.EXPECT.items()}
    expect_docs["uptime_min"] = "The share of the run inside commit gaps within the bound is at least the bound."
    expect_docs["participation_min"] = "The mean number of learners merged per committed round is at least the bound."
    overrides = {"baseline_parity_max": "The final loss within the bound of the known-good baseline stored for "
                                        "the scenario's config and tier (not judged where none is stored)."}
    rows = []
    for name in sorted(PROOFS):
        if name in safety:
            fn, bound = safety[name]
            where = "the verdict" if name != "staleness_bounded" else "property suites"
            holds = overrides.get(name) or first_sentence(fn.__doc__)
        elif name in checks.EXPECT:
            where, holds, bound = "[expect]", first_sentence(expect_docs[name]), f"[expect] `{name}`"
        else:
            where, holds, bound = "property suites", PROPERTY_CHECKS.get(name, ""), "0 violations"
        evidence = _evidence(name, CATALOGUE)
        rows.append({"name": name, "where": where, "holds": holds, "bound": bound, "evidence": evidence,
                     "account": _account(evidence), "proven_by": ", ".join(p.bug for p in PROOFS[name])})
    # a check of the run itself, not of the trainer: no planted bug, a run that ends too soon
    rows.append({"name": "faults_applied", "where": "the verdict", "holds": first_sentence(checks.faults_applied.__doc__),
                 "bound": "every scheduled fault started (UNKNOWN otherwise: not a pass)",
                 "evidence": "independent: the harness's fault_start lines against the schedule in the header",
                 "account": "independent", "proven_by": "a run that ends before its last fault "
                                                          "(suites/cluster/test_faults_applied.py, both tiers)"})
    from diloco_chaos.harness.judging import envelopes

    for name, figure in envelopes.FIGURES.items():  # judged where a known-good envelope is stored
        rows.append({"name": figure.check, "where": "the verdict",
                     "holds": (f"The run's {name.replace('_', ' ')} is "
                               f"{'above the lowest' if figure.higher_is_better else 'below the highest'} value "
                               f"known-good runs of the same scenario kept, "
                               f"{'less' if figure.higher_is_better else 'plus'} a band."),
                     "bound": f"the recorded spread, at least {figure.floor:g}{' of the figure' if figure.relative else ''} "
                              "(not judged where no envelope is stored)",
                     "evidence": "the run's summary (goodput, token-fate ledger, final eval) against "
                                 "harness/scenarios/envelopes.json",
                     "account": "independent",
                     "proven_by": "fetch_discards (simulator" + (", processes" if name == "tokens_merged" else "")
                                  + "; harness/judging/planted.py)"})
    return sorted(rows, key=lambda r: r["name"])


def _evidence(check: str, catalogue: dict) -> str:
    """What the check reads, as the catalogue says for the planted bug it is named to catch."""
    for bug in sorted(catalogue):
        if catalogue[bug].caught_by == check:
            return catalogue[bug].evidence
    return ""


def _account(evidence: str) -> str:
    """Whether the evidence is the system's own word: the catalogue writes `independent` for
    lines of another party, and `own` for a unit's lines about itself."""
    if not evidence:
        return "not recorded"
    if evidence.startswith("independent"):
        return "independent"
    return "own account" if re.search(r"\bown\b", evidence) else "not recorded"


def checks_page() -> str:
    rows = [(f"`{c['name']}`", c["where"], c["holds"], c["bound"], c["evidence"] or "-", c["account"],
             c["proven_by"]) for c in check_table()]
    return "\n\n".join([
        _generated("Checks"),
        "Every check a run's verdict, a scenario's `[expect]` table or a property suite judges. A "
        "check is valid (PASS), not valid (FAIL) or unknown (the log cannot tell; not a pass unless "
        "`--allow-unknown` names it). *Evidence* is what the planted-bug catalogue "
        "(`diloco-chaos planted`) records the check as reading; *own account* means lines a unit "
        "writes about itself (a buggy unit writes them too), *independent* what another party did "
        "or measured. *Proven by*: the planted bugs that make the check fail.",
        table(("check", "judged by", "what it holds", "bound", "evidence", "own word?", "proven by"), rows),
    ]) + "\n"


# ------------------------------------------------------------------ events
def events_page() -> str:
    rows = [(f"`{kind}`", who, what) for kind, (who, what) in sorted(EVENT_KINDS.items())]
    return "\n\n".join([
        _generated("Event kinds (events.jsonl)"),
        "A run's `events.jsonl` holds one JSON object per line, merged by time from every process's "
        "log: `{\"t\": seconds, \"src\": who, \"kind\": ..., **fields}`. Its first line (`config`) is the "
        "header. Metrics and checks read only this file.",
        table(("kind", "written by", "what a line says"), rows),
    ]) + "\n"


# ------------------------------------------------------------------ summary.json
# summary.json's keys besides `Metrics`'s fields: (type, where it comes from, meaning).
SUMMARY_KEYS: dict[str, tuple[str, str]] = {
    "faults_scheduled": ("int", "how many faults the schedule held"),
    "faults_applied": ("int", "how many of them started before the run ended"),
    "run_s": ("float | None", "t_end − t_start, seconds"),
    "stop_kills": ("list | None", "units SIGKILLed after their stop grace at the run's end"),
    "checks": ("list", "each check's result: name, valid (true, false, null = unknown), value, bound, details"),
    "valid": ("bool | None", "the composed verdict: false if a check failed, else null if one is unknown"),
    "run_dir": ("str", "the run directory"),
    "reference_dir": ("str | None", "the fault-free reference run parity was judged against"),
    "gate": ("list", "with `run --baseline RUN`: each `--fail-on` rule against that run"),
    "dp": ("dict", "with `run --compare dp`: the data-parallel run's summary"),
}
METRICS_NOTES = {  # Metrics fields whose meaning its source does not say on the field's line
    "mode": "the training mode", "learners": "learner units", "fragments": "fragments (P)",
    "t_start": "time zero (wall clock): every learner made its first inner step",
    "t_end": "the end of the measured window", "duration_s": "t_end − t_start",
    "allocated_s": "learners × duration_s", "productive_s": "learner time that reached the model",
    "goodput": "productive_s / allocated_s", "badput_s": "learner time lost, by cause (seconds)",
    "learner_goodput": "goodput per learner", "uptime": "the share of the run inside commit gaps ≤ the bound",
    "uptime_s": "seconds of it", "commit_gap_bound_s": "the uptime gap bound, scaled by the run's pace",
    "recovery": "each restart: boot, rejoin, its path, in seconds and fragment cycles",
    "recovery_max_s": "the longest recovery", "final_loss": "the run's final held-out loss",
    "reference_loss": "the fault-free reference's final loss", "loss_parity": "final_loss / reference_loss − 1",
    "reference_rise": "the fault-free reference's own worst rise of its global loss (nats), "
                      "allowed on top of global_loss_regression's bound",
    "loss_floor": "the task's loss floor", "floor_gap": "final_loss − loss_floor",
    "links": "bytes per learner↔shard link, both ways, with mean and peak rates",
    "bytes_total": "bytes on every link", "mean_Bps": "bytes per second over the run",
    "peak_Bps": "the busiest window's bytes per second", "bytes_per_token": "bytes_total / tokens",
    "staleness_hist": "merges by staleness", "staleness_max": "the largest merge staleness",
    "uplink_lag_s": "seconds from a learner's send of a Δ to its shard's read of it: median, p90, max, n "
                    "(a shard that falls behind its learners shows here first)",
    "staleness_mean": "the mean merge staleness", "steps": "inner steps of every learner",
    "tokens": "tokens trained", "merges": "merge lines", "commits": "round commits",
    "step_lag": "steps a learner's step line runs ahead of what it applied",
    "pace": "the run's measured pace (harness/judging/pace.py): 1.0 in the simulator and at or above the "
            "reference machine's",
    "pace_start_s": "the units' cold start the pace was measured from",
}


def summary_keys() -> list[tuple[str, str, str]]:
    """(key, type, meaning) of every top-level key of summary.json, in file order."""
    from diloco_chaos.harness.judging.metrics import Metrics

    comments = field_comments(Metrics)
    rows = [(f.name, str(f.type), METRICS_NOTES.get(f.name) or comments.get(f.name, ""))
            for f in dataclasses.fields(Metrics)]
    rows += [(key, typ, meaning) for key, (typ, meaning) in SUMMARY_KEYS.items()]
    return rows


def summary_page() -> str:
    rows = [(f"`{key}`", typ, meaning) for key, typ, meaning in summary_keys()]
    return "\n\n".join([
        _generated("summary.json"),
        "A run's judgement, written beside its `events.jsonl`: the metrics (computed from the event log "
        "alone), the checks and the verdict. `run --json` prints the same object with `exit_code` added.",
        table(("key", "type", "meaning"), rows),
    ]) + "\n"


# ------------------------------------------------------------------ scenario keys
def scenario_tables() -> list[tuple[str, list[tuple[str, str, str, str]]]]:
    """(table, [(key, type, default, note)]) for every table a scenario file accepts."""
    from diloco_chaos.faults.failures import FailureProcess
    from diloco_chaos.harness.links import LinkProfile
    from diloco_chaos.harness.scenarios.specs import ClusterSpec, Expect, TrainSpec

    top = [("name", "str", "required", "the run's name: lowercase letters, digits, '.', '_' and '-'"),
           ("seed", "int", "required", "the run's seed, in [0, 2**32)"),
           ("description", "str", '""', "one line or more on what the scenario does")]
    out = [("top level", top)]
    for title, cls, unset in (("[cluster]", ClusterSpec, "unset"),
                              ("[train]", TrainSpec, "the trainer's default"),
                              ("[wan]", LinkProfile, "unlimited"),
                              ("[failure_process]", FailureProcess, "unset"),
                              ("[expect]", Expect, "not checked")):
        out.append((title, _dataclass_rows(cls, unset)))
    out.append(("[task]", [("any key", "any", "-", "keyword arguments of a plug-in task (`train.task = "
                                                    "\"package.module:factory\"`)")]))
    out.append(("[[faults]]", [("kind", "str", "required", "a fault kind: see fault-kinds.md"),
                               ("target", "str", "required", "by the kind's role: see fault-kinds.md"),
                               ("at", "duration", "required", "seconds from time zero"),
                               ("the kind's parameters", "-", "-", "see fault-kinds.md")]))
    return out


def _dataclass_rows(cls: type, unset: str) -> list[tuple[str, str, str, str]]:
    comments = field_comments(cls)
    rows = []
    for f in dataclasses.fields(cls):
        typ = "duration" if f.name.endswith("_s") else str(f.type)
        note = comments.get(f.name, "")
        if f.name == "seed" and cls.__name__ == "FailureProcess":
            default = "the scenario's seed"
        else:
            default = shown_default(f, unset)
        rows.append((written_name(f.name), typ, default, note))
    return rows


def scenario_page() -> str:
    parts = [_generated("Scenario keys"),
             "Every key a scenario TOML file accepts, by table. Durations are strings with a unit "
             "(`\"500ms\"`, `\"15s\"`, `\"2m\"`, `\"1h\"`) or plain seconds; a key written `x` may also be "
             "written `x_s`. Keys ending `_ms` take milliseconds, `_kbps` kilobits per second. "
             "`diloco-chaos check FILE` validates a file and shows its fault schedule."]
    for title, rows in scenario_tables():
        parts.append(f"## {title}\n\n" + table(("key", "type", "default", "note"),
                                               [(f"`{k}`", t, d, n) for k, t, d, n in rows]))
    return "\n\n".join(parts) + "\n"


# ------------------------------------------------------------------ command line
def commands() -> list[tuple[str, str, argparse.ArgumentParser]]:
    """(name, one line of help, parser) of every command, in --help order."""
    from diloco_chaos.cli import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    helps = {a.dest: a.help for a in sub._choices_actions}
    return [(name, helps.get(name) or "", p) for name, p in sub.choices.items()]


def options(p: argparse.ArgumentParser) -> list[tuple[str, str, str]]:
    """(how it is written, default, help) of every argument of one command."""
    rows = []
    for a in p._actions:
        if isinstance(a, argparse._HelpAction):
            continue
        name = ", ".join(a.option_strings) if a.option_strings else (a.metavar or a.dest)
        if a.option_strings and a.nargs != 0:
            if a.choices and a.metavar is None:
                name += " {" + ",".join(str(c) for c in a.choices) + "}"
            else:
                name += f" {a.metavar or a.dest.upper()}"
        default = "-" if a.default in (None, False, argparse.SUPPRESS) or not a.option_strings else str(a.default)
        rows.append((name, default, (a.help or "").replace("%%", "%")))
    return rows


def cli_page() -> str:
    from diloco_chaos.cli import EXIT_CODES

    parts = [_generated("Command line"),
             "`diloco-chaos COMMAND [options]` (or `python -m diloco_chaos`). `diloco-chaos COMMAND --help` "
             "says the same as this page.",
             table(("command", "what it does"), [(f"`{n}`", h) for n, h, _ in commands()])]
    for name, help_, p in commands():
        rows = [(f"`{w}`", d, h) for w, d, h in options(p)]
        body = table(("argument", "default", "help"), rows) if rows else "No options."
        parts.append(f"## {name}\n\n{help_}\n\n{body}")
    parts.append("## Exit codes\n\n```\n" + EXIT_CODES + "\n```")
    return "\n\n".join(parts) + "\n"


# ------------------------------------------------------------------ the pages
def _generated(title: str) -> str:
    return (f"# {title}\n\n*Generated from the code by `{REGENERATE}`; do not edit by hand "
            f"(a unit test fails when this page and the code differ).*")


def index_page(names: list[str]) -> str:
    what = {"fault-kinds.md": "the fault kinds: target, parameters, defaults, how each is done",
            "checks.md": "every check: what it holds, its bound, the evidence it reads",
            "events.md": "the event kinds of events.jsonl",
            "summary-json.md": "the keys of summary.json",
            "scenario-keys.md": "every key a scenario file accepts, with its default",
            "cli.md": "every command and option, and the exit codes",
            "scenario.schema.json": "a JSON Schema of scenario files, for editors that complete and validate "
                                    "TOML against one (e.g. `#:schema` in Even Better TOML)"}
    rows = [(f"[{n}]({n})", what.get(n, "")) for n in names]
    return "\n\n".join([
        "# Reference",
        f"These pages are generated from the code. Regenerate them with `{REGENERATE}` after changing "
        f"a fault kind, a check, an event kind, a summary key, a scenario key or a command; "
        f"`{REGENERATE} --check` lists the pages that are out of date "
        "(suites/unit/test_reference_docs.py runs the same comparison).",
        table(("page", "what it holds"), rows),
    ]) + "\n"


PAGES = {"fault-kinds.md": fault_kinds_page, "checks.md": checks_page, "events.md": events_page,
         "summary-json.md": summary_page, "scenario-keys.md": scenario_page, "cli.md": cli_page,
         "scenario.schema.json": lambda: schema_page()}


def schema_page() -> str:
    import json

    from diloco_chaos.schema import scenario_schema

    return json.dumps(scenario_schema(), indent=1, ensure_ascii=False) + "\n"


def pages() -> dict[str, str]:
    """Every reference page: file name -> Markdown, the index first."""
    out = {"README.md": index_page(list(PAGES))}
    out.update({name: build() for name, build in PAGES.items()})
    return out


def stale(directory: Path = REFERENCE_DIR) -> list[str]:
    """The pages whose file in `directory` is missing or differs from `pages()`."""
    out = []
    for name, text in pages().items():
        path = directory / name
        if not path.is_file() or path.read_text(encoding="utf-8") != text:
            out.append(name)
    return out


def write(directory: Path = REFERENCE_DIR) -> list[str]:
    directory.mkdir(parents=True, exist_ok=True)
    for name, text in pages().items():
        (directory / name).write_text(text, encoding="utf-8")
    return sorted(pages())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=REGENERATE, description="Write docs/reference/ from the code.")
    parser.add_argument("--check", action="store_true",
                        help="write nothing; exit 1 listing the pages that differ from the code")
    parser.add_argument("--out", type=Path, default=REFERENCE_DIR, help="the folder (default docs/reference/)")
    args = parser.parse_args(argv)
    if args.check:
        out_of_date = stale(args.out)
        for name in out_of_date:
            print(f"stale: {args.out / name}")
        if out_of_date:
            print(f"regenerate with: {REGENERATE}")
        return 1 if out_of_date else 0
    for name in write(args.out):
        print(f"wrote {args.out / name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
