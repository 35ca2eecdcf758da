#!/usr/bin/env python3
"""Check that every relative link in README.md and docs/*.md resolves.

A link [text](target) whose target is not a URL (no scheme, not mailto:)
must name a file or folder that exists, relative to the Markdown file, and
a #fragment must match a heading of the target file (GitHub's anchors:
lowercase, punctuation dropped, spaces to hyphens). Links inside code
(fenced blocks, `inline spans`) are not links. The user docs (all but the
developer logs in DEV_DOCS) must also name no issue numbers ("issue 12"):
a reader needs what is true, not the history of how it came to be.
Usage: check_links.py [ROOT]. Exit 0 when all is well, 1 with one line per
broken link or issue number otherwise.
"""
import os
import re
import sys

LINK = re.compile(r'(?<!!)\[([^\]]*)\]\(([^)\s]+)(?:\s+"[^"]*")?\)')
ISSUE = re.compile(r'\bissues? #?[0-9]+', re.IGNORECASE)
# Developer records that keep their history: the measurement log, the
# protocol specification and the design notes.
DEV_DOCS = {'perf-log.md', 'pd-protocol.md', 'design.md'}
IMAGE = re.compile(r'!\[([^\]]*)\]\(([^)\s]+)\)')


def strip_code(text):
    """The text with fenced code blocks and inline code spans blanked."""
    out, fenced = [], False
    for line in text.split('\n'):
        if line.lstrip().startswith('```'):
            fenced = not fenced
            out.append('')
            continue
        out.append('' if fenced else re.sub(r'`[^`]*`', '', line))
    return out


def anchors(path):
    """GitHub's anchors for the headings of one Markdown file."""
    seen, result = {}, set()
    fenced = False
    with open(path, encoding='utf-8') as f:
        for line in f:
            if line.lstrip().startswith('```'):
                fenced = not fenced
            if fenced:
                continue
            m = re.match(r'#{1,6}\s+(.*?)\s*#*\s*$', line)
            if not m:
                continue
            a = m.group(1).strip().lower()
            a = re.sub(r'[^\w\- ]', '', a)
            a = a.replace(' ', '-')
            n = seen.get(a, 0)
            seen[a] = n + 1
            result.add(a if n == 0 else '%s-%d' % (a, n))
    return result


def check(root):
    files = [os.path.join(root, 'README.md')]
    docs = os.path.join(root, 'docs')
    files += sorted(os.path.join(docs, f) for f in os.listdir(docs) if f.endswith('.md'))
    bad = []
    for md in files:
        with open(md, encoding='utf-8') as f:
            raw = f.read()
        if os.path.basename(md) not in DEV_DOCS:
            for no, line in enumerate(raw.split('\n'), 1):
                for m in ISSUE.finditer(line):
                    bad.append('%s:%d: names "%s" (say what is true instead)'
                               % (os.path.relpath(md, root), no, m.group(0)))
        lines = strip_code(raw)
        for no, line in enumerate(lines, 1):
            for m in list(LINK.finditer(line)) + list(IMAGE.finditer(line)):
                target = m.group(2)
                if re.match(r'[a-zA-Z][a-zA-Z0-9+.-]*:', target):
                    continue  # http:, https:, mailto:
                path, _, frag = target.partition('#')
                dest = os.path.normpath(os.path.join(os.path.dirname(md), path)) if path else md
                where = '%s:%d: %s' % (os.path.relpath(md, root), no, target)
                if not os.path.exists(dest):
                    bad.append(where + ' (no such file)')
                elif frag and dest.endswith('.md') and frag not in anchors(dest):
                    bad.append(where + ' (no heading #%s)' % frag)
    return bad


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), '..')
    bad = check(root)
    for b in bad:
        print(b)
    if bad:
        print('%d problem(s)' % len(bad))
        return 1
    return 0


if __name__ == '__main__':
    sys.exit(main())
