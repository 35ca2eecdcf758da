#!/usr/bin/env python3
"""schema_check.py — validates the answers of test_structured.sh's keyword
check (pattern, numeric bounds, formats) without the grammar compiler:
Python's re, datetime, ipaddress. Reads chat completion bodies (one JSON
document per file named on the command line); exits 1 naming the first
field that does not validate."""
import datetime
import ipaddress
import json
import re
import sys

EMAIL = re.compile(r"[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+(\.[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+)*"
                   r"@([A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?\.)+[A-Za-z]{2,}")
UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def is_int(v):
    return isinstance(v, int) and not isinstance(v, bool)


def is_num(v):
    return (isinstance(v, (int, float))) and not isinstance(v, bool)


def date_ok(s):
    if not re.fullmatch(r"\d{4}-\d{2}-\d{2}", s):
        return False
    datetime.date.fromisoformat(s)  # raises on 2023-02-29
    return True


def datetime_ok(s):
    m = re.fullmatch(r"(\d{4}-\d{2}-\d{2})T(\d{2}):(\d{2}):(\d{2})(\.\d+)?(Z|[+-]\d{2}:\d{2})", s)
    if not m:
        return False
    d = datetime.datetime.fromisoformat(s.replace("Z", "+00:00"))
    return d.tzinfo is not None and date_ok(m.group(1))


CHECKS = {
    "code": lambda v: isinstance(v, str) and re.fullmatch(r"[A-Z]{2}-\d{3}(x|yz)?", v),
    "q": lambda v: isinstance(v, str) and re.fullmatch(r'"[^"]{0,3}\\', v),
    "n": lambda v: is_int(v) and -20 <= v <= 20,
    "big": lambda v: is_int(v) and 999 < v <= 100000,
    "r": lambda v: is_num(v) and -1.5 <= v < 2,
    "d": lambda v: isinstance(v, str) and date_ok(v),
    "t": lambda v: isinstance(v, str) and datetime_ok(v),
    "e": lambda v: isinstance(v, str) and EMAIL.fullmatch(v),
    "ip": lambda v: isinstance(v, str) and str(ipaddress.IPv4Address(v)) == v,
    "u": lambda v: isinstance(v, str) and UUID.fullmatch(v),
}


def main():
    # the validator itself can fail (so a pass means something)
    bad = {"code": "AB-12", "q": "x", "n": 21, "big": 999, "r": 2, "d": "2023-02-29",
           "t": "2024-01-01T00:00:00", "e": "a@b", "ip": "1.2.3.256", "u": "x"}
    for k, v in bad.items():
        try:
            ok = CHECKS[k](v)
        except ValueError:
            ok = False
        if ok:
            sys.exit(f"validator accepts a bad {k}: {v!r}")
    for path in sys.argv[1:]:
        with open(path) as f:
            body = json.load(f)
        choice = body["choices"][0]
        if choice.get("finish_reason") != "stop":
            sys.exit(f"{path}: finish_reason {choice.get('finish_reason')}: {body}")
        v = json.loads(choice["message"]["content"])
        if sorted(v) != sorted(CHECKS):
            sys.exit(f"{path}: keys {sorted(v)}")
        for k, check in CHECKS.items():
            try:
                ok = check(v[k])
            except ValueError as e:
                ok, v[k] = False, f"{v[k]!r} ({e})"
            if not ok:
                sys.exit(f"{path}: {k} = {v[k]!r} does not validate")
        print(f"{path}: ok {json.dumps(v)}")


main()
