#!/usr/bin/env python3
"""The documentation test's work (scripts/docs_test.sh runs it; see
docs/contributing/testing.md, "The documentation test").

    docs_test.py links
        README.md under its size limit, every page of docs/ listed in
        docs/SUMMARY.md, every relative link of README.md and docs/ pointing at
        a file that exists and, with #anchor, at a heading of it.
    docs_test.py bridge BRIDGE_BIN
        every `envelopes-bridge` command line of a ```sh block and every
        ```toml block (as a --config file) parsed by the bridge with
        --check-config.
    docs_test.py sql PORT [--accept]
        every ```sql block of README.md and of the book's pages (in SUMMARY.md
        order), each page in a fresh database of the server on 127.0.0.1:PORT,
        each block in a psql session of its own; a block followed by an
        ```output block must print exactly that (--accept rewrites those blocks
        with what was printed).
    docs_test.py tour PORT BRIDGE_BIN STATE_DIR
        the README's ten-minute tour as written, against the server on PORT
        (database "tour") and a private nats-server with JetStream (the
        README's 127.0.0.1:5432 and 127.0.0.1:4222 replaced by those): its sql
        blocks in order, `watch` and `egress` in the background, `status`;
        every row of the tour must reach `watch`.

Fence info strings: ```sql runs and must succeed; ```sql fails must fail (the
output then holds the error); ```sql norun: REASON and ```toml norun: REASON
are skipped and must say why.
"""
import os
import re
import shlex
import subprocess
import sys
import tempfile

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
README_LIMIT = 15 * 1000  # bytes: "under 15 KB"
PSQL = os.path.join(os.environ.get("PG_BIN", "/usr/lib/postgresql/15/bin"), "psql")
FENCE = re.compile(r"^```(.*)$")


def rel(path):
    return os.path.relpath(path, ROOT)


def pages():
    """README.md, then the book's pages in the order of docs/SUMMARY.md."""
    summary = os.path.join(ROOT, "docs", "SUMMARY.md")
    out = [os.path.join(ROOT, "README.md")]
    for target in re.findall(r"\]\(([^)#]+\.md)\)", open(summary).read()):
        path = os.path.normpath(os.path.join(ROOT, "docs", target))
        if path not in out:
            out.append(path)
    return out


def all_markdown():
    found = [os.path.join(ROOT, "README.md")]
    for base, _, files in os.walk(os.path.join(ROOT, "docs")):
        found += [os.path.join(base, f) for f in sorted(files) if f.endswith(".md")]
    return found


def blocks(path):
    """Fenced blocks of a page: dicts with info, first and last line index of
    the content, and the content."""
    lines = open(path).read().split("\n")
    out, i = [], 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        start = i + 1
        j = start
        while j < len(lines) and lines[j] != "```":
            j += 1
        if j == len(lines):
            sys.exit(f"{rel(path)}:{i + 1}: a code block that never closes")
        out.append({"info": m.group(1).strip(), "line": i + 1, "start": start,
                    "end": j, "text": "\n".join(lines[start:j])})
        i = j + 1
    return out, lines


# --- links ---------------------------------------------------------------

def slug(heading):
    """GitHub's anchor of a heading."""
    text = re.sub(r"`", "", heading.strip().lower())
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path):
    found, fenced = set(), False
    for line in open(path).read().split("\n"):
        if line.startswith("```"):
            fenced = not fenced
            continue
        m = re.match(r"^#{1,6} (.*)$", line)
        if m and not fenced:
            found.add(slug(m.group(1)))
    return found


def check_links():
    failures = []
    size = os.path.getsize(os.path.join(ROOT, "README.md"))
    if size >= README_LIMIT:
        failures.append(f"README.md is {size} bytes; keep it under {README_LIMIT}")
    listed = set(pages())
    for path in all_markdown():
        if path not in listed and not path.endswith("docs/SUMMARY.md"):
            failures.append(f"{rel(path)} is not listed in docs/SUMMARY.md (add it there: "
                            "every page of the book must be reachable from its table of contents)")
    count = 0
    for path in all_markdown():
        text, fenced = [], False
        for line in open(path).read().split("\n"):
            if line.startswith("```"):
                fenced = not fenced
                continue
            if not fenced:
                text.append(re.sub(r"`[^`]*`", "", line))
        for target in re.findall(r"\]\(([^)\s]*)\)", "\n".join(text)):
            if not target or re.match(r"^[a-z]+:", target):
                continue  # an empty draft entry of SUMMARY.md, or a URL
            count += 1
            file, _, anchor = target.partition("#")
            dest = os.path.normpath(os.path.join(os.path.dirname(path), file)) if file else path
            if not os.path.exists(dest):
                failures.append(f"{rel(path)}: link to {target}: no such file")
            elif anchor and dest.endswith(".md") and anchor not in anchors(dest):
                failures.append(f"{rel(path)}: link to {target}: no such heading")
    for f in failures:
        print(f"docs: {f}", file=sys.stderr)
    print(f"README.md: {size} bytes; {count} relative links checked")
    return not failures


# --- bridge command lines and configuration files ------------------------

def bridge_env():
    return {k: v for k, v in os.environ.items() if not k.startswith("ENVELOPES_")}


def check_bridge(binary):
    failures, checked = [], 0
    full_config = None
    with tempfile.TemporaryDirectory() as tmp:
        configs = []
        for path in pages():
            found, _ = blocks(path)
            for b in found:
                kind = b["info"].split()[0] if b["info"] else ""
                if kind == "toml":
                    if b["info"].startswith("toml norun"):
                        if not re.match(r"toml norun: \S", b["info"]):
                            failures.append(f"{rel(path)}:{b['line']}: norun without a reason")
                        continue
                    file = os.path.join(tmp, f"{len(configs)}.toml")
                    open(file, "w").write(b["text"] + "\n")
                    configs.append((path, b["line"], file))
                    if full_config is None and path.endswith("bridge/configuration.md"):
                        full_config = file
        for path, line, file in configs:
            checked += 1
            failures += run_bridge(binary, ["run", "--config", file], f"{rel(path)}:{line}")
        for path in pages():
            found, _ = blocks(path)
            for b in found:
                if (b["info"].split() or [""])[0] != "sh":
                    continue
                for n, command in commands(b["text"]):
                    words = shlex.split(command, comments=True)
                    if not words or words[0] != "envelopes-bridge":
                        continue
                    # A --config file the docs name but do not ship: the
                    # configuration page's complete example stands in for it.
                    for i, w in enumerate(words[:-1]):
                        if w == "--config" and not os.path.exists(words[i + 1]):
                            words[i + 1] = full_config
                    checked += 1
                    failures += run_bridge(binary, words[1:], f"{rel(path)}:{b['line'] + n}")
    for f in failures:
        print(f"docs: {f}", file=sys.stderr)
    print(f"bridge: {checked} command lines and configuration files parsed")
    return not failures


def commands(text):
    """(line offset, command) of a shell block, continuation lines joined."""
    out, current, first = [], "", 0
    for n, line in enumerate(text.split("\n"), start=1):
        if not current:
            first = n
        if line.rstrip().endswith("\\"):
            current += line.rstrip()[:-1] + " "
            continue
        out.append((first, current + line))
        current = ""
    return out


def run_bridge(binary, args, where):
    if "--check-config" not in args:
        args = args + ["--check-config"]
    p = subprocess.run([binary] + args, env=bridge_env(),
                       capture_output=True, text=True, timeout=60)
    if p.returncode != 0:
        return [f"{where}: envelopes-bridge {' '.join(args)}: exit {p.returncode}: "
                f"{(p.stderr or p.stdout).strip()}"]
    return []


# --- SQL -------------------------------------------------------------------

def psql(port, db, sql, stop_on_error=True):
    args = [PSQL, "-X", "-q", "-h", "127.0.0.1", "-p", str(port), "-U", "postgres", "-d", db]
    if stop_on_error:
        args += ["-v", "ON_ERROR_STOP=1"]
    p = subprocess.run(args + ["-f", "-"], input=sql, capture_output=True, text=True,
                       timeout=300, env=dict(os.environ, PGTZ="UTC", PGDATESTYLE="ISO, MDY"))
    out = (p.stdout + p.stderr).split("\n")
    out = [re.sub(r"^psql:<stdin>:\d+: ", "", line).rstrip() for line in out]
    while out and out[-1] == "":
        out.pop()
    return p.returncode, "\n".join(out)


def normalize(text):
    lines = [line.rstrip() for line in text.split("\n")]
    while lines and lines[-1] == "":
        lines.pop()
    return "\n".join(lines)


def check_sql(port, accept):
    failures, ran, compared, skipped = [], 0, 0, 0
    for number, path in enumerate(pages()):
        found, lines = blocks(path)
        sql = [(i, b) for i, b in enumerate(found) if (b["info"].split() or [""])[0] == "sql"]
        if not sql:
            continue
        db = f"docs_{number}"
        psql(port, "postgres", f'DROP DATABASE IF EXISTS "{db}"; CREATE DATABASE "{db}";')
        creates = any(re.search(r"^\s*CREATE EXTENSION", b["text"], re.M) for _, b in sql)
        if not creates:
            code, out = psql(port, db, "CREATE EXTENSION pg_envelopes;")
            if code != 0:
                sys.exit(f"{rel(path)}: CREATE EXTENSION failed: {out}")
        edits = []
        for i, b in sql:
            where = f"{rel(path)}:{b['line']}"
            info = b["info"]
            if info.startswith("sql norun"):
                if not re.match(r"sql norun: \S", info):
                    failures.append(f"{where}: norun without a reason")
                skipped += 1
                continue
            if info not in ("sql", "sql fails"):
                failures.append(f"{where}: unknown info string {info!r}")
                continue
            fails = info == "sql fails"
            code, out = psql(port, db, b["text"], stop_on_error=not fails)
            ran += 1
            if fails and "ERROR:" not in out:
                failures.append(f"{where}: marked `sql fails` but did not fail:\n{out}")
            if not fails and (code != 0 or "ERROR:" in out):
                failures.append(f"{where}: failed:\n{out}")
                continue
            # The output block, if any: the next block, with only blank lines between.
            nxt = found[i + 1] if i + 1 < len(found) else None
            if nxt is None or nxt["info"] != "output" or \
                    any(lines[k].strip() for k in range(b["end"] + 1, nxt["line"] - 1)):
                continue
            compared += 1
            if normalize(nxt["text"]) != out:
                if accept:
                    edits.append((nxt["start"], nxt["end"], out))
                else:
                    failures.append(f"{where}: output differs\n--- shown\n{normalize(nxt['text'])}\n"
                                    f"+++ printed\n{out}")
        if accept and edits:
            for start, end, out in sorted(edits, reverse=True):
                lines[start:end] = out.split("\n") if out else []
            open(path, "w").write("\n".join(lines))
            print(f"{rel(path)}: {len(edits)} output blocks rewritten")
        psql(port, "postgres", f'DROP DATABASE IF EXISTS "{db}";')
    for f in failures:
        print(f"docs: {f}", file=sys.stderr)
    print(f"sql: {ran} blocks run, {compared} outputs compared, {skipped} marked norun")
    return not failures


# --- the README's tour, bridge included ------------------------------------

def check_tour(port, binary, state):
    import signal
    import socket
    import time

    def free():
        # Below the kernel's ephemeral range, as scripts/lib.sh's free_port.
        import random
        for p in random.sample(range(20000, 32000), 12000):
            s = socket.socket()
            try:
                s.bind(("127.0.0.1", p))
            except OSError:
                continue
            finally:
                s.close()
            return p
        sys.exit("no free port")

    nats_port, metrics_port = free(), free()
    nats_bin = os.environ.get("ENVELOPES_TEST_NATS_SERVER", "/usr/sbin/nats-server")
    os.makedirs(state, exist_ok=True)
    procs = []
    failures = []

    def sub(text):
        return (text.replace("127.0.0.1:5432", f"127.0.0.1:{port}")
                    .replace("127.0.0.1:4222", f"127.0.0.1:{nats_port}")
                    .replace("127.0.0.1:9187", f"127.0.0.1:{metrics_port}"))

    def start(args, name):
        out = open(os.path.join(state, name + ".out"), "w")
        err = open(os.path.join(state, name + ".err"), "w")
        procs.append(subprocess.Popen(args, stdout=out, stderr=err, env=bridge_env()))
        return os.path.join(state, name + ".out")

    def wait_for(path, ids, seconds=30):
        deadline = time.time() + seconds
        while time.time() < deadline:
            text = open(path).read()
            if all(f'"id":"{i}"' in text for i in ids):
                return True
            time.sleep(0.2)
        return False

    watch_out = None
    try:
        start([nats_bin, "-a", "127.0.0.1", "-p", str(nats_port), "-js", "-sd",
               os.path.join(state, "nats")], "nats")
        deadline = time.time() + 20
        while True:  # until the server accepts connections
            try:
                socket.create_connection(("127.0.0.1", nats_port), timeout=1).close()
                break
            except OSError:
                if time.time() > deadline:
                    sys.exit(f"nats-server on {nats_port} did not start: see {state}/nats.err")
                time.sleep(0.1)
        psql(port, "postgres", 'DROP DATABASE IF EXISTS tour; CREATE DATABASE tour;')
        psql(port, "tour", "CREATE EXTENSION pg_envelopes;")
        found, _ = blocks(os.path.join(ROOT, "README.md"))
        started_egress = False
        for b in found:
            kind = (b["info"].split() or [""])[0]
            if kind == "sql" and b["info"] == "sql":
                if "CREATE EXTENSION" in b["text"]:
                    continue  # the install section's; done above
                code, out = psql(port, "tour", b["text"])
                if code != 0:
                    failures.append(f"README.md:{b['line']}: {out}")
            if kind != "sh":
                continue
            for _, command in commands(b["text"]):
                words = shlex.split(sub(command), comments=True)
                if not words or words[0] != "envelopes-bridge":
                    continue
                args = [binary] + words[1:]
                if words[1] == "watch":
                    watch_out = start(args, "watch")
                    # Subscribed before egress publishes: it says so on stderr.
                    deadline = time.time() + 20
                    while "watching" not in open(os.path.join(state, "watch.err")).read():
                        if time.time() > deadline:
                            sys.exit(f"watch never subscribed: see {state}/watch.err")
                        time.sleep(0.1)
                elif words[1] == "egress":
                    start(args, "egress")
                    started_egress = True
                elif words[1] == "status":
                    # what egress had when the tour was written: its rows delivered
                    if watch_out and not wait_for(watch_out, ["2:4"]):
                        failures.append("the tour's last envelope (2:4) never reached watch")
                    p = subprocess.run(args, env=bridge_env(), capture_output=True, text=True,
                                       timeout=60)
                    if p.returncode != 0 or "tour" not in p.stdout:
                        failures.append(f"status: exit {p.returncode}: {p.stdout}{p.stderr}")
        if not started_egress or watch_out is None:
            failures.append("the tour has no `envelopes-bridge watch` and `egress`")
        else:
            ids = ["1:1", "1:2", "1:3", "2:1", "2:2", "2:3", "2:4", "outbox:1"]
            if not wait_for(watch_out, ids, 5):
                failures.append(f"watch did not show every row of the tour ({', '.join(ids)}):\n"
                                + open(watch_out).read())
    finally:
        for p in reversed(procs):
            p.send_signal(signal.SIGTERM)
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
    for f in failures:
        print(f"docs: {f}", file=sys.stderr)
    print("tour: watch showed every row; status answered" if not failures else "tour: failed")
    return not failures


def main():
    what = sys.argv[1] if len(sys.argv) > 1 else ""
    if what == "links":
        ok = check_links()
    elif what == "bridge" and len(sys.argv) == 3:
        ok = check_bridge(sys.argv[2])
    elif what == "sql" and len(sys.argv) in (3, 4):
        ok = check_sql(int(sys.argv[2]), sys.argv[3:] == ["--accept"])
    elif what == "tour" and len(sys.argv) == 5:
        ok = check_tour(int(sys.argv[2]), sys.argv[3], sys.argv[4])
    else:
        sys.exit(__doc__)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
