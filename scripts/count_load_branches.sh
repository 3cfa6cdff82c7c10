#!/usr/bin/env bash
# Branches on the kind of load (closed loop: users; open loop: an arrival rate) in loadtest/, tuning/
# and distill/ (the default paths), each line once, then the total: issue 56's goal is at most 6.
# Counted: tests of a level's or a run's rate or concurrency for None/zero (`level.rate is None`,
# `if run.rate`), of the sweep's loop (`loop == "open"`, `s.get("rates")`), of whether open-loop levels
# exist (`any(... rate_levels ...)`), open-loop flags handed on (`open_loop=...`, `if open_loop`), and
# isinstance tests against Closed/Open.
cd "$(dirname "$0")/.." || exit 1
[ $# -gt 0 ] || set -- loadtest tuning distill
pattern='\b(level|lv|run|self|s)\.(rate|concurrency) is (not )?None|\.rate > 0|\bloop [!=]= |any\(True for _ in rate_levels|get\("rates"\)|(if|not|bool\() ?(run|level|lv|self)\.rate(:| else|\))|\b(if|not|and|or) \(?open_loop\b|(^|[^._a-z])open_loop (and|or|else)\b|\b(if|not|and|or) [a-z_.]*\.scheduled\b|isinstance\([^)]*(\b(Open|Closed)\b|\.load\b)|\bif per_rate\b'
grep -rnE "$pattern" --include=*.py "$@" | grep -vE '^\S+:\s*#'
grep -rnE "$pattern" --include=*.py "$@" | grep -vcE '^\S+:\s*#'
