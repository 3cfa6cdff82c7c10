#!/usr/bin/env bash
# String-key lookups (x["key"], x['key'], x.get("key")) per file, then the total: issue 56's goal is at most 250
# over loadtest/, tuning/ and distill/ (the default paths).
cd "$(dirname "$0")/.." || exit 1
[ $# -gt 0 ] || set -- loadtest tuning distill
pattern="\[\s*[\"'][A-Za-z_0-9 .-]+[\"']\s*\]|\.get\(\s*[\"'][^\"']+[\"']"
grep -rEo "$pattern" --include=*.py "$@" | cut -d: -f1 | sort | uniq -c | sort -n
grep -rEo "$pattern" --include=*.py "$@" | wc -l
