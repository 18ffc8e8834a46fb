#!/usr/bin/env python3
"""How the Catch2 executables are registered with CTest (cmake/ScalemmDiscoverTests.cmake).

Usage: check_registration.py BUILD_DIR SOURCE_DIR

Checks, on the tests CTest knows in BUILD_DIR:
  * every Catch2 case is registered exactly once, under "<executable>:<case>";
  * its labels and properties follow its tags: [gpu] cases are labelled gpu with SKIP_RETURN_CODE 77,
    [gpu][serial] ones also RUN_SERIAL, every other case is labelled host;
  * listing the cases of any executable prints no CMake warning (an executable without [gpu] cases
    used to give "contains no tests!");
  * without a CUDA device a [gpu] case exits 77 and says why, in words ("no CUDA device ..."), and
    tools/skip-reasons.sh turns those lines of the test log into one line per reason.
"""
import json
import os
import subprocess
import sys
import tempfile

BUILD, SOURCE = sys.argv[1], sys.argv[2]


def ctest_tests():
    # From a folder of its own: a CTest run writes Testing/Temporary/LastTest.log where it runs, and this
    # test runs inside the suite, whose log (tools/skip-reasons.sh reads it) must stay whole.
    with tempfile.TemporaryDirectory() as d:
        with open(os.path.join(d, "CTestTestfile.cmake"), "w") as f:
            f.write(f'subdirs("{os.path.abspath(BUILD)}")\n')
        p = subprocess.run(["ctest", "--show-only=json-v1"], cwd=d, capture_output=True, text=True, check=True)
    tests = []
    for t in json.loads(p.stdout)["tests"]:
        props = {prop["name"]: prop["value"] for prop in t.get("properties", [])}
        tests.append((t["name"], t.get("command", []), props))
    return tests


def list_cases(exe, spec):
    p = subprocess.run([exe, spec, "--list-test-names-only"], capture_output=True, text=True)
    assert p.returncode >= 0, f"{exe} {spec} --list-test-names-only died: {p.stderr}"
    return [line for line in p.stdout.splitlines() if line]


def main():
    tests = ctest_tests()
    names = [n for n, _, _ in tests]
    dup = sorted({n for n in names if names.count(n) > 1})
    assert not dup, f"registered more than once: {dup[:5]}"
    not_built = [n for n in names if "not built" in n]
    assert not not_built, f"test executables not built (build all targets first): {not_built}"

    by_exe = {}
    for name, cmd, props in tests:
        if not cmd or not os.path.basename(cmd[0]).startswith("test_"):
            continue
        exe = cmd[0]
        prefix = os.path.basename(exe) + ":"
        if not name.startswith(prefix) or len(cmd) != 2:
            continue  # hand-registered tests (test_layouts_emu, C API) run a whole program
        by_exe.setdefault(exe, {})[name[len(prefix):]] = props
    assert by_exe, "no Catch2 tests registered"

    for exe, registered in sorted(by_exe.items()):
        classes = {
            "host": set(list_cases(exe, "~[gpu]")),
            "gpu": set(list_cases(exe, "[gpu]~[serial]")),
            "serial": set(list_cases(exe, "[gpu][serial]")),
        }
        every = set().union(*classes.values())
        assert set(registered) == every, (
            f"{exe}: registered cases differ from the executable's: missing {sorted(every - set(registered))[:3]}, "
            f"extra {sorted(set(registered) - every)[:3]}")
        for cls, cases in classes.items():
            for case in cases:
                props = registered[case]
                labels = props.get("LABELS", [])
                want = ["host"] if cls == "host" else ["gpu"]
                assert labels == want, f"{exe}: {case!r} ({cls}) has labels {labels}, wanted {want}"
                skip = props.get("SKIP_RETURN_CODE")
                assert (skip == 77) == (cls != "host"), f"{exe}: {case!r} ({cls}) SKIP_RETURN_CODE {skip}"
                assert bool(props.get("RUN_SERIAL")) == (cls == "serial"), f"{exe}: {case!r} ({cls}) RUN_SERIAL"

        # Listing again prints no warning, whatever classes are empty.
        with tempfile.TemporaryDirectory() as d:
            p = subprocess.run(["cmake", f"-DTEST_EXECUTABLE={exe}", f"-DTEST_PREFIX={os.path.basename(exe)}:",
                                f"-DTEST_WORKING_DIR={d}", f"-DCTEST_FILE={d}/tests.cmake", "-P",
                                os.path.join(SOURCE, "cmake", "ScalemmDiscoverTests.cmake")],
                               capture_output=True, text=True)
            assert p.returncode == 0 and "Warning" not in p.stderr + p.stdout, (exe, p.stdout, p.stderr)

    # Without a device, a [gpu] case is skipped with its reason in words.
    exe, registered = next((e, r) for e, r in sorted(by_exe.items())
                           if any(p.get("LABELS") == ["gpu"] for p in r.values()))
    case = next(c for c, p in registered.items() if p.get("LABELS") == ["gpu"])
    spec = case
    for ch in ",[]":
        spec = spec.replace(ch, "\\" + ch)
    p = subprocess.run([exe, spec], capture_output=True, text=True)
    if p.returncode == 77:
        line = next((l for l in p.stdout.splitlines() if l.startswith("SKIPPED [gpu]")), None)
        assert line, p.stdout
        reason = line.split('": ', 1)[1]
        assert reason.startswith(("no CUDA device", "no usable CUDA device")), line
        assert "InsufficientDriver" not in reason, line
        with tempfile.TemporaryDirectory() as d:
            os.makedirs(os.path.join(d, "Testing", "Temporary"))
            with open(os.path.join(d, "Testing", "Temporary", "LastTest.log"), "w") as f:
                f.write("1/2 Testing: x\n" + line + "\n" + line.replace(case, "another case") + "\n")
            out = subprocess.run(["bash", os.path.join(SOURCE, "tools", "skip-reasons.sh"), d], capture_output=True,
                                 text=True, check=True).stdout
            assert f"2 [gpu] test(s): {reason}" in out, out
    else:
        assert p.returncode == 0, (exe, case, p.stdout[-2000:])  # a machine with a GPU runs it
    print(f"ok: {sum(len(r) for r in by_exe.values())} cases of {len(by_exe)} executables, each registered once")


if __name__ == "__main__":
    main()
