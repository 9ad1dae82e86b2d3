"""Content-addressed deployment of a bundle (bundle.py) to a target, over its transport.

WORKDIR/objects/<sha256>   every file ever sent, named by its hash (written atomically)
WORKDIR/bundles/<id>/      a bundle: hard links into objects/ (copies where the file system
                           has none), plus .complete
WORKDIR/jobs/<run>/<job>/  a job's spec, result and logs

A file whose hash is already in objects/ is never sent again. A bundle is assembled in a
folder of this deploy's own by one script that stops at the first step that fails (sh -eu;
an `a && b || c` chain would let a later step's success hide an earlier failure), checks
the size of every file, and only then writes .complete and gives the folder the bundle's
name: a transfer or copy cut off half-way is never used, and the next deploy finishes it.
Two deploys of one bundle at once (two targets on one board and workdir) each assemble
their own; the first rename wins and the other copy is dropped, so a bundle in use is never
replaced.
"""
from __future__ import annotations

import hashlib
import json
import shlex
from pathlib import Path

from workloads.jsonfile import temp_name

from harness import guarded
from harness.preparation.artifacts import content_id
from harness.boards.transport import TransportError

# Part files and assembly folders of deploys that were killed are removed after this long.
STALE_MINUTES = 24 * 60
REFUSED = 3         # the prepare script's exit when the workdir resolves to a folder not zobench's


def deploy(transport, workdir: str, files: dict[str, Path], ids: dict[str, tuple[str, int]] | None = None) -> str:
    """Make sure the bundle of `files` is complete on the target; return its directory there.
    `ids` (path in the bundle -> artifacts.content_id of the file) saves hashing files the
    caller already hashed; the bundle is what they were then."""
    if ids is None:
        ids = {rel: content_id(p) for rel, p in files.items()}
    hashes = {rel: digest for rel, (digest, _) in ids.items()}
    bundle_id = hashlib.sha256(json.dumps(sorted(hashes.items())).encode()).hexdigest()[:20]
    objects, bundles = f"{workdir}/objects", f"{workdir}/bundles"
    bundle = f"{bundles}/{bundle_id}"
    q = shlex.quote
    # the workdir as the board resolves it (symlinks followed), refused before anything is made in
    # it where that is /, the home folder itself or a system folder (guarded.SYSTEM): a workdir
    # linked to / would put bundles/, jobs/, objects/ and the lease in the board's root
    system = " | ".join(q(f) for f in guarded.SYSTEM)
    rc, out, err = transport.exec("sh -eu", stdin=(
        f"workdir={q(workdir)} objects={q(objects)} bundles={q(bundles)} bundle={q(bundle)}\n"
        'mkdir -p "$workdir"\n'
        'real=$(cd "$workdir" && pwd -P) home=$(cd && pwd -P)\n'
        f'case "$real" in {system} | "$home") echo "refused $real" >&2; exit {REFUSED};; esac\n'
        'if [ -f "$bundle/.complete" ]; then echo present; exit 0; fi\n'
        'mkdir -p "$objects" "$bundles"\n'
        f'find "$objects" "$bundles" -maxdepth 1 -name "*.part-*" -mmin +{STALE_MINUTES} -exec rm -rf {{}} + || true\n'
        'ls "$objects"\n'))
    if rc == REFUSED and err.startswith("refused "):
        real = err.strip()[len("refused "):]
        raise TransportError(f"{transport.where}: workdir {workdir} resolves to {real} there, "
                             f"{'a system folder' if real in guarded.SYSTEM else 'the home folder'}; give zobench a "
                             "folder of its own, like ~/zobench")
    if rc != 0:
        raise TransportError(f"{transport.where}: cannot prepare {workdir}: {err.strip() or out.strip()}")
    lines = out.split()
    if lines[:1] == ["present"]:
        return bundle
    have, missing = set(lines), {}
    for rel, digest in hashes.items():
        if digest not in have:
            missing.setdefault(digest, files[rel])
    # in one go: over tar (a board whose sshd has no SFTP) one stream, not a channel per file
    transport.put_many(objects, missing)
    sent = list(missing)
    # verify what this deploy sent (an object already there was checked by the deploy that sent it,
    # and the assembly checks its size)
    if sent:
        rc, out, err = transport.exec(f"cd {q(objects)} && sha256sum {' '.join(sent)}", timeout=300)
        good = {line.split()[0] for line in out.splitlines() if line.split()[:1] and
                line.split()[0] == line.split()[-1]}
        bad = [d for d in sent if d not in good]
        if bad:
            transport.exec(f"cd {q(objects)} && rm -f {' '.join(bad)}")
            rel = next(r for r, d in hashes.items() if d in bad)
            if content_id(files[rel]) != ids[rel]:
                raise TransportError(f"{transport.where}: {files[rel]} changed on this machine while it was being "
                                     "deployed; run again")
            raise TransportError(f"{transport.where}: {len(bad)} file(s) arrived corrupted (e.g. {rel}); deploy again")
    rc, out, err = transport.exec("sh -eu", stdin=assembly(objects, bundle, temp_name(f"{bundles}/.{bundle_id}"), ids),
                                  timeout=300)
    if rc != 0:
        why = [line for line in err.splitlines() if line.strip()]
        raise TransportError(f"{transport.where}: cannot assemble the bundle in {workdir}: "
                             f"{why[-1][-300:] if why else f'exit status {rc}'}")
    return bundle


def assembly(objects: str, bundle: str, tmp: str, ids: dict[str, tuple[str, int]]) -> str:
    """The sh -eu script that links the bundle together in tmp from objects/, checks each
    file's size, and renames tmp to bundle once complete. A damaged object (wrong size) is
    removed, so the next deploy sends it again."""
    q = shlex.quote
    tmp_name = tmp.rsplit("/", 1)[1]
    lines = [f"objects={q(objects)} bundle={q(bundle)} tmp={q(tmp)} old={q(tmp + '.old')}",
             'if [ -f "$bundle/.complete" ]; then exit 0; fi',      # a deploy beside this one finished it
             """trap 'rm -rf "$tmp"' EXIT""",
             'mkdir "$tmp"',
             'place() {',
             '  ln -f "$objects/$1" "$tmp/$2" 2>/dev/null || why=$(cp "$objects/$1" "$tmp/$2" 2>&1) ||'
             ' { echo "$2: $why" >&2; exit 1; }',
             '  n=$(wc -c < "$tmp/$2")',
             '  if [ $n -ne $3 ]; then rm -f "$objects/$1"; echo "$2: $n bytes on the target instead of $3;'
             ' its damaged copy there is removed, deploy again" >&2; exit 1; fi',
             '}']
    lines += [f'mkdir -p "$tmp"/{q(d)}' for d in sorted({str(Path(rel).parent) for rel in ids} - {"."})]
    lines += [f"place {digest} {q(rel)} {size}" for rel, (digest, size) in ids.items()]
    lines += [f'chmod +x "$tmp"/{q(rel)}' for rel in ids if rel.startswith("bin/")]
    lines += ['touch "$tmp/.complete"',
              # an incomplete bundle under the name (left by a deploy of an older zobench, or
              # damaged by hand) is no one's: move it aside
              'if [ -e "$bundle" ] && [ ! -f "$bundle/.complete" ]; then mv "$bundle" "$old"; fi',
              # where a deploy beside this one renamed its copy first, mv puts ours inside it: drop ours
              'mv "$tmp" "$bundle"',
              f'rm -rf "$bundle"/{q(tmp_name)}',
              'test -f "$bundle/.complete"',
              'if [ -e "$old" ] && [ ! -f "$old/.complete" ]; then rm -rf "$old"; fi']
    return "\n".join(lines) + "\n"
