#!/usr/bin/env bash
# Writes envelopes-bridge(1), in roff, to stdout: made from the binary's own
# --help (the top level and every subcommand), so it says what the binary does.
#
#   scripts/bridge_manpage.sh BINARY VERSION [EPOCH]
#
# EPOCH (unix seconds) dates the page; default now. Used by scripts/package.sh.
set -euo pipefail

bin=${1:?usage: $0 BINARY VERSION [EPOCH]}
version=${2:?usage: $0 BINARY VERSION [EPOCH]}
epoch=${3:-$(date +%s)}

# The help as a user without ENVELOPES_* variables sees it (clap shows an
# environment variable's value beside its option), wrapped with
# each continuation indented like the text it continues (after a "label  "
# column where there is one), since man shows these lines as they are (72
# columns: man indents them by 7).
raw_help() { env -i PATH=/usr/bin:/bin "$bin" "$@" --help; }
help() { raw_help "$@" | wrap; }
wrap() {
    python3 -c '
import re, sys, textwrap
for line in sys.stdin.read().splitlines():
    if len(line) <= 72:
        print(line)
        continue
    m = re.match(r"^(\s*\S.*?\s{2,})(?=\S)", line) if line.startswith(" ") else None
    indent = " " * len(m.group(1)) if m and len(m.group(1)) < 40 else re.match(r"\s*", line).group(0)
    print(textwrap.fill(line, 72, subsequent_indent=indent, break_on_hyphens=False, break_long_words=False))
'
}

# roff for text shown as it is: backslashes escaped, a leading . or ' made
# literal, hyphens as minus signs (options are typed with them).
verbatim() { sed -e 's/\\/\\e/g' -e "s/^\\([.']\\)/\\\\\\&\\1/" -e 's/-/\\-/g'; }

top=$(help)
top_raw=$(raw_help)
# The first paragraph of --help is the description; "Commands:" lists the
# subcommands, two spaces in.
description=$(printf '%s\n' "$top" | sed -n '1,/^$/p' | sed '/^$/d')
commands=$(printf '%s\n' "$top" | sed -n '/^Commands:/,/^$/p' | sed -n 's/^  \([a-z][a-z-]*\) .*/\1/p' | grep -vx help)
[ -n "$commands" ] || { echo "no subcommands found in $bin --help" >&2; exit 1; }

cat <<EOF
.TH ENVELOPES\\-BRIDGE 1 "$(date -u -d "@$epoch" +%Y-%m-%d)" "envelopes\\-bridge $version" "User Commands"
.SH NAME
envelopes\\-bridge \\- forward committed pg_envelopes rows to message buses and back
.SH SYNOPSIS
.B envelopes\\-bridge
.RI [ OPTIONS ]
.I COMMAND
.RI [ ARGS ]
.br
.B envelopes\\-bridge run \\-\\-config
.I FILE
.SH DESCRIPTION
$(printf '%s\n' "$description" | verbatim)
.PP
Every option also reads an environment variable (shown in brackets below), and
a TOML file given with \\fB\\-\\-config\\fR may give any option by its long name;
flags win over the environment, the environment over the file.
.SH OPTIONS
.nf
$(printf '%s\n' "$top" | sed -n '/^Options:/,$p' | verbatim)
.fi
.SH COMMANDS
EOF
for c in $commands; do
    echo ".SS $(printf '%s' "$c" | verbatim)"
    echo ".nf"
    # `run --help` exits 78 asking for --config (bridge 0.1.0): then the line
    # of the top-level list and the usage the unit runs.
    if text=$(help "$c" 2>/dev/null); then
        printf '%s\n' "$text" | verbatim
    else
        printf '%s\n' "$top_raw" | sed -n "s/^  $c  *//p" | wrap | verbatim
        printf '\nUsage: envelopes-bridge %s --config FILE\n' "$c" | verbatim
    fi
    echo ".fi"
done
cat <<'EOF'
.SH EXIT STATUS
.TP
.B 0
stopped by a signal, or a command that ends by itself (status, register, watch) done
.TP
.B 1
a failure at start (the metrics address taken)
.TP
.B 2
a usage error
.TP
.B 78
a configuration the servers refuse before the bridge ever worked (a wrong
password or role, a missing database, a database without the extension, an
unknown consumer, a refused bus login, a bad \-\-config file); the systemd unit
does not restart on it
.TP
.B 128 + signal
a second SIGTERM (143) or SIGINT (130)
.SH FILES
.TP
.I /etc/envelopes\-bridge/NAME.toml
the configuration of the systemd instance envelopes\-bridge@NAME
(\fBsystemctl enable \-\-now envelopes\-bridge@NAME\fR); keep it root's and 0600,
the unit hands the service a private copy
.TP
.I /lib/systemd/system/envelopes\-bridge@.service
the unit template
.TP
.I /usr/share/doc/envelopes\-bridge/examples/example.toml
an example configuration
.SH SEE ALSO
.BR systemctl (1),
.BR systemd.exec (5);
the pg_envelopes README (/usr/share/doc/postgresql\-15\-pg\-envelopes/README.md.gz
where that package is installed) and the reference book in the source tree,
docs/bridge/ (configuration with every key, one page per sink, exit codes,
leases, failover, ingress).
EOF
