#!/usr/bin/env python3
"""hub_fixture.py — a local stand-in for the Hugging Face hub, for
tests/e2e/test_pull.sh (kvseal pull). Two ThreadingHTTPServers on
127.0.0.1: the "hub" and a "CDN" on another port, so the test can see what
each was sent.

The hub serves the repositories under --root (ROOT/ORG/REPO/... files,
names starting with '.' hidden) in the hub's API shape:
  GET /api/models/ORG/REPO/tree/REV[?recursive=true][&cursor=K]
      a JSON array of {type, oid, size, path, lfs: {oid (sha256), size,
      pointerSize}}, paged by a Link: <...>; rel="next" header when the
      control file sets page_size; REV must be "main"
  GET /ORG/REPO/resolve/REV/PATH
      302 to the CDN, with X-Linked-Etag (the sha256, quoted), X-Linked-Size,
      ETag and X-Repo-Commit
404 with X-Error-Code RepoNotFound / RevisionNotFound / EntryNotFound, and
401 for a gated repository without its bearer token.

The CDN serves the bytes with Range support (206 + Content-Range, 416 past
the end).

The control file (--control, JSON, re-read at every request) sets:
  gated:       {"ORG/REPO": "TOKEN"}   the repositories that need a token
  extra:       {"ORG/REPO": [entries]} listing entries added as they are
               (hostile names: "../x.gguf"; never served)
  page_size:   N                       listing entries per page
  next_elsewhere: true                 the next page's link names the CDN's port
  drop_after:  N                       the CDN sends N bytes of an answer
  drop_limit:  K                       for the first K answers (since the
               control file last changed), then closes the connection
  corrupt:     true                    the CDN flips one byte in the middle
  ignore_range: true                   a Range gets the whole file with a 200
  bad_range:   true                    a Range gets a 206 from byte 0 (whole file)
  slow:        true                    the CDN sends 64 KiB every 50 ms
  cdn_status:  N                       the CDN answers every request with status N
Every request is logged to --log as one JSON line: {"server": "hub"|"cdn",
"path", "range", "auth"}. The ports go to --port-file as "HUB CDN" once both
listen (written to a temporary name, then renamed).
usage: hub_fixture.py --root DIR --control FILE --log FILE --port-file FILE
                      [--tls-cert PEM --tls-key PEM]
"""
import argparse
import hashlib
import json
import os
import ssl
import sys
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

ARGS = None
LOCK = threading.Lock()
STATE = {"control_text": None, "drops": 0}
PORTS = {}
SHA_CACHE = {}


def control():
    """The control file's settings; resets the drop count when it changed."""
    try:
        with open(ARGS.control) as f:
            text = f.read()
    except OSError:
        text = "{}"
    with LOCK:
        if text != STATE["control_text"]:
            STATE["control_text"] = text
            STATE["drops"] = 0
    return json.loads(text or "{}")


def log(entry):
    with LOCK:
        with open(ARGS.log, "a") as f:
            f.write(json.dumps(entry) + "\n")


def sha256_of(path):
    st = os.stat(path)
    key = (path, st.st_size, st.st_mtime_ns)
    if key not in SHA_CACHE:
        h = hashlib.sha256()
        with open(path, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
        SHA_CACHE[key] = h.hexdigest()
    return SHA_CACHE[key]


def repo_dir(org, name):
    if not org or not name or org.startswith(".") or name.startswith("."):
        return None
    d = os.path.join(ARGS.root, org, name)
    return d if os.path.isdir(d) else None


def listing(d):
    out = []
    for base, dirs, files in os.walk(d):
        dirs[:] = sorted(x for x in dirs if not x.startswith("."))
        rel = os.path.relpath(base, d)
        if rel != ".":
            out.append({"type": "directory", "oid": "0" * 40, "size": 0, "path": rel})
        for fn in sorted(files):
            if fn.startswith("."):
                continue
            p = os.path.join(base, fn)
            rp = fn if rel == "." else rel + "/" + fn
            size = os.path.getsize(p)
            out.append({"type": "file", "oid": hashlib.sha1(rp.encode()).hexdigest(),
                        "size": size, "path": rp,
                        "lfs": {"oid": sha256_of(p), "size": size, "pointerSize": 134}})
    return out


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    role = "hub"

    def log_message(self, fmt, *args):  # quiet: the JSON log says it all
        pass

    def send(self, status, body=b"", headers=None):
        self.send_response(status)
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def error(self, status, code, msg):
        body = json.dumps({"error": msg}).encode()
        self.send(status, body, {"Content-Type": "application/json", "X-Error-Code": code,
                                 "X-Error-Message": msg})

    def do_GET(self):
        url = urllib.parse.urlsplit(self.path)
        log({"server": self.role, "path": self.path, "range": self.headers.get("Range"),
             "auth": self.headers.get("Authorization")})
        ctl = control()
        if self.role == "cdn":
            return self.cdn(url, ctl)
        parts = url.path.split("/")
        # /api/models/ORG/REPO/tree/REV
        if len(parts) >= 7 and parts[1:3] == ["api", "models"] and parts[5] == "tree":
            return self.tree(parts[3], parts[4], urllib.parse.unquote(parts[6]), url, ctl)
        # /ORG/REPO/resolve/REV/PATH
        if len(parts) >= 6 and parts[3] == "resolve":
            path = urllib.parse.unquote("/".join(parts[5:]))
            return self.resolve(parts[1], parts[2], urllib.parse.unquote(parts[4]), path, ctl)
        self.error(404, "NotFound", "no such route")

    def gate(self, repo, ctl):
        """False (after answering 401) when repo is gated and the token is wrong."""
        tok = ctl.get("gated", {}).get(repo)
        if tok is None or self.headers.get("Authorization") == "Bearer " + tok:
            return True
        self.error(401, "GatedRepo", "Access to model %s is restricted" % repo)
        return False

    def tree(self, org, name, rev, url, ctl):
        d = repo_dir(org, name)
        repo = org + "/" + name
        if d is None:
            return self.error(404, "RepoNotFound", "Repository not found")
        if not self.gate(repo, ctl):
            return
        if rev != "main":
            return self.error(404, "RevisionNotFound", "Invalid rev id: " + rev)
        entries = listing(d) + ctl.get("extra", {}).get(repo, [])
        q = urllib.parse.parse_qs(url.query)
        start = int(q.get("cursor", ["0"])[0])
        size = int(ctl.get("page_size", 0)) or len(entries) or 1
        page = entries[start:start + size]
        headers = {"Content-Type": "application/json"}
        if start + size < len(entries):
            nq = dict(q, cursor=[str(start + size)])
            port = PORTS["cdn" if ctl.get("next_elsewhere") else "hub"]
            nxt = "http://127.0.0.1:%d%s?%s" % (port, url.path,
                                                urllib.parse.urlencode(nq, doseq=True))
            headers["Link"] = '<%s>; rel="next"' % nxt
        self.send(200, json.dumps(page).encode(), headers)

    def resolve(self, org, name, rev, path, ctl):
        d = repo_dir(org, name)
        repo = org + "/" + name
        if d is None:
            return self.error(404, "RepoNotFound", "Repository not found")
        if not self.gate(repo, ctl):
            return
        if rev != "main":
            return self.error(404, "RevisionNotFound", "Invalid rev id: " + rev)
        p = os.path.normpath(os.path.join(d, path))
        if not p.startswith(d + os.sep) or not os.path.isfile(p):
            return self.error(404, "EntryNotFound", "Entry not found")
        sha = sha256_of(p)
        loc = "http://127.0.0.1:%d/cdn/%s/%s/%s?sig=fixture" % (
            PORTS["cdn"], org, name, urllib.parse.quote(path))
        self.send(302, b"", {"Location": loc, "X-Linked-Etag": '"%s"' % sha,
                             "X-Linked-Size": str(os.path.getsize(p)), "ETag": '"%s"' % sha,
                             "X-Repo-Commit": "0" * 40})

    def cdn(self, url, ctl):
        if ctl.get("cdn_status"):  # e.g. 403: an expired signed URL
            return self.send(int(ctl["cdn_status"]), b"<Error>AccessDenied</Error>")
        parts = urllib.parse.unquote(url.path).split("/")  # /cdn/ORG/REPO/PATH
        d = repo_dir(parts[2], parts[3]) if len(parts) >= 5 else None
        p = os.path.normpath(os.path.join(d, "/".join(parts[4:]))) if d else ""
        if not d or not p.startswith(d + os.sep) or not os.path.isfile(p):
            return self.send(404, b"not found")
        with open(p, "rb") as f:
            data = bytearray(f.read())
        if ctl.get("corrupt"):
            data[len(data) // 2] ^= 0xFF
        start, status, headers = 0, 200, {"Content-Type": "application/octet-stream",
                                           "Accept-Ranges": "bytes"}
        rng = self.headers.get("Range")
        if rng and not ctl.get("ignore_range"):
            if not rng.startswith("bytes=") or not rng[6:].endswith("-"):
                return self.send(400, b"only bytes=N- ranges")
            start = int(rng[6:-1])
            if ctl.get("bad_range"):
                start = 0  # a 206 for another range than asked
            if start >= len(data):
                return self.send(416, b"", {"Content-Range": "bytes */%d" % len(data)})
            status = 206
            headers["Content-Range"] = "bytes %d-%d/%d" % (start, len(data) - 1, len(data))
        body = bytes(data[start:])
        drop = None
        with LOCK:
            if "drop_after" in ctl and STATE["drops"] < int(ctl.get("drop_limit", 1)):
                STATE["drops"] += 1
                drop = int(ctl["drop_after"])
        self.send_response(status)
        for k, v in headers.items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if ctl.get("slow"):
            # 64 KiB every 50 ms (about 1.3 MB/s): a download still running
            # when the test interrupts it
            for i in range(0, len(body), 65536):
                self.wfile.write(body[i:i + 65536])
                self.wfile.flush()
                time.sleep(0.05)
            return
        if drop is not None and drop < len(body):
            self.wfile.write(body[:drop])
            self.wfile.flush()
            self.close_connection = True
            self.connection.shutdown(2)  # the connection drops mid-body
            return
        self.wfile.write(body)


class Cdn(Handler):
    role = "cdn"


def main():
    global ARGS
    ap = argparse.ArgumentParser()
    ap.add_argument("--root", required=True)
    ap.add_argument("--control", required=True)
    ap.add_argument("--log", required=True)
    ap.add_argument("--port-file", required=True)
    ap.add_argument("--tls-cert")
    ap.add_argument("--tls-key")
    ARGS = ap.parse_args()
    ARGS.root = os.path.realpath(ARGS.root)
    hub = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    cdn = ThreadingHTTPServer(("127.0.0.1", 0), Cdn)
    if ARGS.tls_cert:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(ARGS.tls_cert, ARGS.tls_key)
        hub.socket = ctx.wrap_socket(hub.socket, server_side=True)
    hub.daemon_threads = cdn.daemon_threads = True
    PORTS["hub"], PORTS["cdn"] = hub.server_address[1], cdn.server_address[1]
    threading.Thread(target=cdn.serve_forever, daemon=True).start()
    tmp = ARGS.port_file + ".tmp"
    with open(tmp, "w") as f:
        f.write("%d %d\n" % (PORTS["hub"], PORTS["cdn"]))
    os.rename(tmp, ARGS.port_file)
    try:
        hub.serve_forever()
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
