"""Offline lint of deploy/docker/ (no Docker engine needed): the Dockerfile's
stages, build flags, runtime packages (cross-checked against the libraries the
built binaries really need), non-root user, health check, COPY sources versus
.dockerignore, and the entrypoint's dispatch run against stub binaries."""

import fnmatch
import json
import os
import re
import shlex
import shutil
import subprocess
import tempfile

import pdgwtest

SRC = pdgwtest.SOURCE_DIR
DOCKER_DIR = os.path.join(SRC, "deploy", "docker")
DOCKERFILE = os.path.join(DOCKER_DIR, "Dockerfile")
ENTRYPOINT = os.path.join(DOCKER_DIR, "entrypoint.sh")
BINARIES = ["pdgw", "pdgw-sim", "kvt-bench"]
BASE_IMAGE = "debian:bookworm-slim"
# Packages every debian:bookworm-slim image already has.
BASE_PACKAGES = {"libc6", "libgcc-s1", "libstdc++6", "zlib1g"}
SANITIZER_LIBS = ("libasan", "libubsan", "liblsan", "libtsan")


# ------------------------------------------------------------------ parsing


def parse_dockerfile(path):
    """[(instruction, argument string, line number)] with continuations joined."""
    out = []
    with open(path) as f:
        lines = f.read().split("\n")
    buf, start = "", 0
    for no, raw in enumerate(lines, 1):
        line = raw.rstrip()
        if not buf and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if buf and line.lstrip().startswith("#"):
            continue  # comment lines inside a continued instruction
        if not buf:
            start = no
        if line.endswith("\\"):
            buf += line[:-1] + " "
            continue
        buf += line
        instr, _, args = buf.strip().partition(" ")
        out.append((instr.upper(), args.strip(), start))
        buf = ""
    assert not buf, "Dockerfile ends inside a continued line"
    return out


def stages(instrs):
    """[{name, image, instrs}] with ARG defaults substituted into FROM."""
    args, result = {}, []
    for instr, rest, no in instrs:
        if instr == "ARG" and not result:
            k, _, v = rest.partition("=")
            args[k] = v
            continue
        if instr == "FROM":
            words = rest.split()
            flags = [w for w in words if w.startswith("--")]
            words = [w for w in words if not w.startswith("--")]
            image = re.sub(r"\$\{(\w+)\}|\$(\w+)",
                           lambda m: args.get(m.group(1) or m.group(2), ""), words[0])
            name = words[2] if len(words) >= 3 and words[1].upper() == "AS" else None
            result.append({"name": name, "image": image, "flags": flags, "instrs": [],
                           "line": no})
            continue
        assert result, f"line {no}: {instr} before FROM"
        result[-1]["instrs"].append((instr, rest, no))
    return result


def apt_packages(stage):
    pkgs = []
    for instr, rest, _ in stage["instrs"]:
        if instr != "RUN" or "apt-get install" not in rest:
            continue
        for part in rest.split("&&"):
            if "apt-get install" in part:
                words = shlex.split(part.split("apt-get install", 1)[1])
                pkgs += [w for w in words if not w.startswith("-")]
    return pkgs


def dockerignore_patterns():
    path = os.path.join(SRC, ".dockerignore")
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [l.strip() for l in f if l.strip() and not l.startswith("#")]


def ignored(relpath, patterns):
    """Docker's rule: the last matching pattern wins; '!' re-includes."""
    result = False
    parts = relpath.split("/")
    for pat in patterns:
        neg = pat.startswith("!")
        p = pat[1:] if neg else pat
        p = p.rstrip("/")
        hit = False
        for i in range(1, len(parts) + 1):  # a pattern matching a parent excludes children
            prefix = "/".join(parts[:i])
            if fnmatch.fnmatchcase(prefix, p) or \
                    (p.startswith("**/") and fnmatch.fnmatchcase(prefix, p[3:])) or \
                    (p.startswith("**/") and fnmatch.fnmatchcase(parts[i - 1], p[3:])):
                hit = True
                break
        if hit:
            result = not neg
    return result


def _load():
    instrs = parse_dockerfile(DOCKERFILE)
    return instrs, stages(instrs)


# ------------------------------------------------------------------ tests


def test_stages():
    _, st = _load()
    assert len(st) >= 2, "multi-stage build expected"
    for s in st:
        assert s["image"] == BASE_IMAGE, f"stage {s['name']} from {s['image']}"
    names = [s["name"] for s in st]
    assert names[0] == "build" and names[-1] == "runtime", names
    assert len(set(names)) == len(names), names


def test_build_stage():
    _, st = _load()
    build = st[0]
    runs = " ".join(r for i, r, _ in build["instrs"] if i == "RUN")
    assert "-DPDGW_BUILD_TESTS=OFF" in runs, "tests must be off in the image build"
    m = re.search(r"--target ([\w\- ]+?)(?:\s*&&|$)", runs)
    assert m, "cmake --build --target ... expected"
    targets = m.group(1).split()
    assert sorted(targets) == sorted(BINARIES), targets
    # The target names are the binaries this very tree builds.
    for b in BINARIES:
        pdgwtest.binary(b)
    # Every -dev package the installer knows is installed in the build stage.
    with open(os.path.join(SRC, "deploy", "install-deps.sh")) as f:
        wanted = set(re.findall(r"\b(lib[\w.+-]+-dev)\b", f.read()))
    wanted.discard("libcmocka-dev")  # unit tests only; the image builds with tests off
    have = set(apt_packages(build))
    assert wanted <= have, f"build stage lacks {sorted(wanted - have)}"
    assert {"cmake", "pkg-config", "build-essential"} <= have


_NEEDED = {}
_APT_KNOWN = {}


def _needed_packages(binary):
    """Debian packages of the shared libraries <binary> links directly
    (memoised: the broken-Dockerfile cases ask again)."""
    if binary in _NEEDED:
        return _NEEDED[binary]
    out = subprocess.run(["readelf", "-d", binary], capture_output=True, text=True,
                         check=True).stdout
    needed = re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", out)
    ldd = subprocess.run(["ldd", binary], capture_output=True, text=True, check=True).stdout
    paths = dict(re.findall(r"^\s*(\S+) => (\S+)", ldd, re.M))
    for path in re.findall(r"^\s*(/\S+) \(0x", ldd, re.M):  # the dynamic loader
        paths.setdefault(os.path.basename(path), path)
    real = {}
    for soname in needed:
        if soname.startswith(SANITIZER_LIBS):
            continue
        path = paths.get(soname)
        assert path and path != "not", f"{binary}: {soname} not found"
        real[soname] = os.path.realpath(path)
    # One dpkg query for all; with merged /usr dpkg may know the /lib spelling.
    queries = sorted(set(real.values()) | {p.replace("/usr/lib/", "/lib/", 1)
                                           for p in real.values()})
    res = subprocess.run(["dpkg", "-S", *queries], capture_output=True, text=True)
    owner = {}
    for line in res.stdout.splitlines():
        pkg, _, path = line.partition(": ")
        owner[path.strip()] = pkg.split(":")[0].strip()
    pkgs = {}
    for soname, path in real.items():
        pkg = owner.get(path) or owner.get(path.replace("/usr/lib/", "/lib/", 1))
        assert pkg, f"{soname}: no Debian package owns {path}"
        pkgs[soname] = pkg
    _NEEDED[binary] = pkgs
    return pkgs


def test_runtime_packages():
    _, st = _load()
    runtime = st[-1]
    have = set(apt_packages(runtime))
    assert not any(p.endswith("-dev") for p in have), f"-dev packages at runtime: {have}"
    assert "curl" in have, "the HEALTHCHECK uses curl"
    if shutil.which("dpkg") is None or shutil.which("readelf") is None:
        raise AssertionError("dpkg and readelf are needed to cross-check runtime libraries")
    missing = {}
    for b in BINARIES:
        for soname, pkg in _needed_packages(pdgwtest.binary(b)).items():
            if pkg not in have and pkg not in BASE_PACKAGES:
                missing[soname] = pkg
    assert not missing, f"runtime stage lacks the packages of {missing}"
    # Every package named exists in the archive (when apt metadata is present).
    if shutil.which("apt-cache"):
        key = tuple(sorted(have))
        if key not in _APT_KNOWN:
            res = subprocess.run(["apt-cache", "show", "--no-all-versions", *key],
                                 capture_output=True, text=True)
            _APT_KNOWN[key] = set(re.findall(r"^Package: (\S+)", res.stdout, re.M))
        known = _APT_KNOWN[key]
        if known:  # no metadata at all: nothing to compare with
            assert have <= known, f"unknown packages {sorted(have - known)}"


def test_runtime_stage_user_health_ports():
    _, st = _load()
    runtime = st[-1]
    instrs = runtime["instrs"]
    users = [r for i, r, _ in instrs if i == "USER"]
    assert users, "runtime stage has no USER"
    user = users[-1].split(":")[0]
    assert user not in ("root", "0"), f"runs as {user}"
    runs = " ".join(r for i, r, _ in instrs if i == "RUN")
    if user.isdigit():
        assert f"--uid {user}" in runs, f"uid {user} is not created in the image"
    # The last USER comes after every RUN (nothing runs as root after it is set
    # except what must).
    hc = [r for i, r, _ in instrs if i == "HEALTHCHECK"]
    assert len(hc) == 1 and "/health" in hc[0] and "CMD" in hc[0], hc
    port_var = re.search(r"\$\{?(\w+)\}?/health", hc[0])
    if port_var:
        envs = " ".join(r for i, r, _ in instrs if i == "ENV")
        assert port_var.group(1) in envs, f"{port_var.group(1)} has no default ENV"
    exposed = set()
    for i, r, _ in instrs:
        if i == "EXPOSE":
            exposed |= {p.split("/")[0] for p in r.split()}
    assert "8000" in exposed, exposed
    ep = [r for i, r, _ in instrs if i == "ENTRYPOINT"]
    assert ep, "no ENTRYPOINT"
    argv = json.loads(ep[-1])  # exec form: signals reach the process
    assert isinstance(argv, list) and argv
    copied = [r.split()[-1] for i, r, _ in instrs if i == "COPY"]
    for path in argv:
        if path.startswith("/usr/local/bin/pdgw"):
            assert path in copied, f"{path} is not copied into the image"


def test_apt_hygiene():
    """Every apt-get install: in the same RUN as its update, -y, no recommends,
    lists removed afterwards (small layers, no stale index baked in)."""
    _, st = _load()
    for s in st:
        for instr, rest, no in s["instrs"]:
            if instr != "RUN" or "apt-get install" not in rest:
                continue
            assert "apt-get update" in rest.split("apt-get install")[0], \
                f"line {no}: apt-get update must run in the same RUN before install"
            assert "--no-install-recommends" in rest and " -y" in rest, f"line {no}"
            assert "rm -rf /var/lib/apt/lists/*" in rest.split("apt-get install")[1], \
                f"line {no}: apt lists not removed"


def test_copy_sources():
    _, st = _load()
    patterns = dockerignore_patterns()
    assert patterns, "root .dockerignore missing"
    for p in ("build", ".git"):
        assert ignored(p, patterns), f".dockerignore should exclude {p}"
    names = []
    for s in st:
        for instr, rest, no in s["instrs"]:
            if instr not in ("COPY", "ADD"):
                continue
            words = rest.split()
            flags = [w for w in words if w.startswith("--")]
            paths = [w for w in words if not w.startswith("--")]
            assert len(paths) >= 2, f"line {no}: COPY needs source and destination"
            frm = [f.split("=", 1)[1] for f in flags if f.startswith("--from=")]
            if frm:
                assert frm[0] in names, f"line {no}: --from={frm[0]} is not an earlier stage"
                src_stage = next(x for x in st if x["name"] == frm[0])
                runs = " ".join(r for i, r, _ in src_stage["instrs"] if i == "RUN")
                for src in paths[:-1]:
                    assert src.rstrip("/") in runs, \
                        f"line {no}: {src} is not produced in stage {frm[0]}"
                continue
            for src in paths[:-1]:
                rel = src.rstrip("/")
                full = os.path.join(SRC, rel)
                assert os.path.exists(full), f"line {no}: COPY source {src} does not exist"
                assert not ignored(rel, patterns), f"line {no}: {src} excluded by .dockerignore"
        names.append(s["name"])
    # The sources CMake needs are all in the build stage.
    build_copies = " ".join(r for i, r, _ in st[0]["instrs"] if i == "COPY")
    for d in ("CMakeLists.txt", "kvtransfer/", "scheduler/", "forwarders/", "gateway/",
              "tests/"):
        assert d in build_copies, f"build stage does not copy {d}"


def test_entrypoint_dispatch():
    subprocess.run(["sh", "-n", ENTRYPOINT], check=True)
    assert os.access(ENTRYPOINT, os.X_OK), "entrypoint.sh must be executable"
    stub = tempfile.mkdtemp(prefix="pdgw-stub.")
    try:
        for b in BINARIES:
            path = os.path.join(stub, b)
            with open(path, "w") as f:
                f.write(f'#!/bin/sh\necho "{b} $*"\n')
            os.chmod(path, 0o755)
        env = dict(os.environ, PATH=stub + ":" + os.environ.get("PATH", "/usr/bin:/bin"))

        def run(*args):
            return subprocess.run(["sh", ENTRYPOINT, *args], capture_output=True, text=True,
                                  env=env, timeout=10).stdout.strip()

        assert run() == "pdgw --config /etc/pdgw/pdgw.yaml", run()
        assert run("pdgw-sim", "--role", "both") == "pdgw-sim --role both"
        assert run("kvt-bench", "--help") == "kvt-bench --help"
        assert run("pdgw", "--check-config", "x") == "pdgw --check-config x"
        assert run("--listen", "0.0.0.0:9") == "pdgw --listen 0.0.0.0:9"
        assert run("echo", "plain") == "plain"
    finally:
        shutil.rmtree(stub)


def test_image_config_exists():
    _, st = _load()
    copies = [r for i, r, _ in st[-1]["instrs"] if i == "COPY" and "pdgw.yaml" in r]
    assert copies and copies[0].split()[-1] == "/etc/pdgw/pdgw.yaml", copies
    with open(os.path.join(DOCKER_DIR, "pdgw.yaml")) as f:
        text = f.read()
    assert "listen:" in text and "0.0.0.0" in text, "the image must listen on all interfaces"


def test_broken_dockerfile_rejected():
    """Broken copies of the Dockerfile must fail the checks above."""
    global DOCKERFILE
    with open(DOCKERFILE) as f:
        good = f.read()
    cases = [
        ("root user", "USER 10001:10001", "USER root", test_runtime_stage_user_health_ports),
        ("no health check", "HEALTHCHECK --interval", "LABEL x=y --interval",
         test_runtime_stage_user_health_ports),
        ("missing COPY source", "COPY deploy/docker/entrypoint.sh",
         "COPY deploy/docker/entrypoint-missing.sh", test_copy_sources),
        ("tests on", "-DPDGW_BUILD_TESTS=OFF", "-DPDGW_BUILD_TESTS=ON", test_build_stage),
        ("runtime lib dropped", "libmicrohttpd12 ", "", test_runtime_packages),
        ("wrong base", "ARG DEBIAN_IMAGE=debian:bookworm-slim", "ARG DEBIAN_IMAGE=ubuntu:24.04",
         test_stages),
        ("COPY from a later stage", "COPY --from=build", "COPY --from=later", test_copy_sources),
        ("apt lists kept", "    && rm -rf /var/lib/apt/lists/*\n\n# Fixed", "\n# Fixed",
         test_apt_hygiene),
    ]
    saved = DOCKERFILE
    tmp = tempfile.mkdtemp(prefix="pdgw-dockerfile.")
    try:
        for desc, old, new, check in cases:
            assert old in good, f"{desc}: {old!r} not in the Dockerfile"
            DOCKERFILE = os.path.join(tmp, "Dockerfile")
            with open(DOCKERFILE, "w") as f:
                f.write(good.replace(old, new, 1))
            try:
                check()
            except AssertionError as e:
                print(f"  {desc}: rejected ({str(e)[:80]})")
            else:
                raise AssertionError(f"{desc}: broken Dockerfile accepted")
            finally:
                DOCKERFILE = saved
    finally:
        DOCKERFILE = saved
        shutil.rmtree(tmp)


if __name__ == "__main__":
    pdgwtest.run([test_stages, test_build_stage, test_runtime_packages,
                  test_runtime_stage_user_health_ports, test_apt_hygiene, test_copy_sources,
                  test_entrypoint_dispatch, test_image_config_exists,
                  test_broken_dockerfile_rejected])
