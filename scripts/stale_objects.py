#!/usr/bin/env python3
"""Lists ninja outputs built from an input that changed while their command ran.

Ninja before 1.12 decides that an output is up to date when its mtime is newer than
every input's. An input saved while the compiler is running (a header edited, or a
git checkout, during a long compile) leaves an object compiled from the old text
that ninja never rebuilds, since the object is written after the edit. If the old
text had another class layout, the binary links objects that disagree on it (one
inline accessor read another member's bytes: issue #21's graph_replays() of 0).

For each output the build log (.ninja_log) and the depfile dependencies
(ninja -t deps) know, the command's start is its output mtime less its run time;
an input modified more than SLACK seconds after that start marks the output stale.
Usage: stale_objects.py [--remove] BUILD_DIR [TARGET...]
  TARGET...: only the objects these targets are built from (default: all).
  --remove: delete the stale outputs, so that the next ninja rebuilds them.
Exit status 1 when any output is stale. stale_objects.py --self-test checks the
detection on a small ninja project (needs ninja).
"""
import os
import pathlib
import subprocess
import sys
import tempfile

SLACK = 1.0  # seconds: an output's mtime falls a little before its command's end


def build_log(build_dir: pathlib.Path) -> dict:
    """output -> (start_ms, end_ms, mtime_ns) of its last build."""
    entries = {}
    with open(build_dir / ".ninja_log") as log:
        for line in log:
            if line.startswith("#"):
                continue
            fields = line.rstrip("\n").split("\t")
            if len(fields) >= 4:
                entries[fields[3]] = (int(fields[0]), int(fields[1]), int(fields[2]))
    return entries


def depfile_deps(build_dir: pathlib.Path) -> dict:
    """output -> the inputs its depfile named (sources and headers)."""
    text = subprocess.run(["ninja", "-C", str(build_dir), "-t", "deps"], capture_output=True, text=True,
                          check=True).stdout
    deps, current = {}, None
    for line in text.splitlines():
        if not line.strip():
            current = None
        elif not line.startswith(" "):
            current = line.split(":")[0]
            deps[current] = []
        elif current is not None:
            deps[current].append(line.strip())
    return deps


def stale_outputs(build_dir: pathlib.Path, targets: list) -> list:
    """(output, input, seconds the input changed after the command began, whether ninja sees it too:
    the input is newer than the output), one per stale output."""
    log = build_log(build_dir)
    deps = depfile_deps(build_dir)
    wanted = None
    if targets:
        text = subprocess.run(["ninja", "-C", str(build_dir), "-t", "inputs", *targets], capture_output=True,
                              text=True, check=True).stdout
        wanted = set(text.split()) | set(targets)
    found = []
    for output, inputs in deps.items():
        if output not in log or (wanted is not None and output not in wanted):
            continue
        start_ms, end_ms, mtime_ns = log[output]
        if mtime_ns == 0:
            continue
        began = mtime_ns / 1e9 - (end_ms - start_ms) / 1000.0
        for path in inputs:
            try:
                modified = os.stat(build_dir / path).st_mtime
            except OSError:
                continue  # gone: ninja itself rebuilds the output
            if modified > began + SLACK:
                found.append((output, path, modified - began, modified > mtime_ns / 1e9))
                break
    return found


def self_test() -> int:
    """A slow compile of a.c whose header changes midway must be reported, and a quiet one not."""
    with tempfile.TemporaryDirectory() as tmp:
        d = pathlib.Path(tmp)
        (d / "a.h").write_text("#define V 1\n")
        (d / "a.c").write_text('#include "a.h"\nint v = V;\n')
        # The "compiler" reads the header, sleeps 3 s, then writes the object (a new mtime) and a depfile naming the header.
        (d / "build.ninja").write_text(
            "rule cc\n"
            "  command = cat a.c a.h > $out.tmp && sleep 3 && cp $out.tmp $out && printf '$out: a.c a.h\\n' > $out.d\n"
            "  depfile = $out.d\n  deps = gcc\n"
            "build a.o: cc a.c | a.h\n")
        ninja = subprocess.Popen(["ninja", "-C", str(d)], stdout=subprocess.DEVNULL)
        import time
        time.sleep(1.5)
        (d / "a.h").write_text("#define V 2\n")  # saved while the command runs
        ninja.wait()
        stale = stale_outputs(d, ["a.o"])
        if [s[0] for s in stale] != ["a.o"] or stale[0][1] != "a.h":
            print(f"self-test FAILED: a header edited mid-compile was not reported ({stale})")
            return 1
        (d / "a.o").unlink()
        subprocess.run(["ninja", "-C", str(d)], stdout=subprocess.DEVNULL, check=True)
        stale = stale_outputs(d, ["a.o"])
        if stale:
            print(f"self-test FAILED: a clean rebuild was reported stale ({stale})")
            return 1
    print("self-test passed")
    return 0


def main(argv: list) -> int:
    if argv[1:] == ["--self-test"]:
        return self_test()
    remove = "--remove" in argv[1:]
    args = [a for a in argv[1:] if a != "--remove"]
    if not args:
        print(__doc__)
        return 2
    build_dir = pathlib.Path(args[0])
    stale = stale_outputs(build_dir, args[1:])
    for output, path, seconds, out_of_date in stale:
        why = "newer than it: not rebuilt yet" if out_of_date else "while it was built: ninja misses this"
        print(f"stale: {output} (its input {path} changed {seconds:.1f} s after the command began, {why})")
        if remove:
            (build_dir / output).unlink(missing_ok=True)
    if stale and not remove:
        print(f"rebuild them: {argv[0]} --remove {' '.join(args)} && ninja -C {build_dir} ...")
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
