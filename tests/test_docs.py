"""The repo explains itself: every document that code, configs, tests and docs cite is a file of the repo.

A reference is a path ending in `.md` (`docs/spec.md`, `training.md#diagnostics`), a markdown link
`[text](target)`, or a section sign `§N` (`docs/spec.md §4`, `§6-7`, `§2, §9`). A path resolves
against the citing file's folder, the repo's root or `docs/` (a bare file name, such as the
`results.md` a comparison writes, may also name any file of the repo with that name); an `#anchor` must
be a heading of the target (GitHub's slugs), and `§N` a numbered heading (`## N. ...`) of the nearest
file named before it on the same line, else of the citing markdown file itself. A `§` in code with no
file before it, and the names of documents kept outside the repo (`HACPO_SPEC`, `DESIGN §`), are errors.
"""

from __future__ import annotations

import ast
import io
import os
import re
import tokenize
from functools import lru_cache
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SUFFIXES = {".py", ".md", ".yaml", ".yml", ".toml", ".cfg", ".txt"}
SKIP_DIRS = {".git", ".venv", ".venv-vllm", "__pycache__", "build", "dist", "runs", "outputs", ".pytest_cache",
             ".hypothesis", ".cache", "eval", "zoo_weights", "fixtures"}
OUTSIDE = re.compile(r"HACPO_SPEC|\bDESIGN(?:\.md| ?§)|\bresearch/\w+\.md")
"""Documents that are not in the repo (the project's own reference is docs/spec.md, docs/engineering.md)."""
MD_PATH = re.compile(r"(?<![\w/.-])((?:[\w.-]+/)*[\w.-]+\.md)(#[\w-]+)?")
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
SECTION = re.compile(r"§\s?(\d+(?:\.\d+)*)(?:\s?[-–]\s?(\d+))?")
NUMBERED = re.compile(r"^#{1,6}\s+(\d+(?:\.\d+)*)\.?\s", re.M)


def scanned_files(root: Path = REPO) -> list[Path]:
    """Code, configs, tests and docs of the repo (this file aside: its docstring shows the patterns)."""
    files = []
    for folder, dirs, names in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d not in SKIP_DIRS and not d.endswith(".egg-info"))
        for name in sorted(names):
            path = Path(folder, name)
            if (path.suffix in SUFFIXES or name == "Makefile") and path.resolve() != Path(__file__).resolve():
                files.append(path)
    return files


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


@lru_cache(maxsize=None)
def headings(path: Path) -> tuple[frozenset[str], frozenset[str]]:
    """(anchors, section numbers) of a markdown file."""
    text = path.read_text(errors="replace")
    anchors, seen = set(), {}
    for line in re.findall(r"^#{1,6}\s+(.+?)\s*#*$", text, flags=re.M):
        base = slug(line)
        anchors.add(base if base not in seen else f"{base}-{seen[base]}")
        seen[base] = seen.get(base, 0) + 1
    return frozenset(anchors), frozenset(NUMBERED.findall(text))


@lru_cache(maxsize=None)
def _by_name(root: Path) -> dict[str, Path]:
    return {p.name: p for p in scanned_files(root) if p.suffix == ".md"}


def resolve(target: str, citing: Path, root: Path = REPO) -> Path | None:
    """The file a referenced path names, or None."""
    for base in (citing.parent, root, root / "docs"):
        if (base / target).is_file():
            return (base / target).resolve()
    return _by_name(root).get(target) if "/" not in target else None


def _check_target(target: Path | None, what: str, anchor: str, sections: list[str]) -> list[str]:
    if target is None:
        return [f"{what}: no such file in the repo"]
    problems = []
    anchors, numbers = headings(target)
    if anchor and anchor not in anchors:
        problems.append(f"{what}: no heading with the anchor #{anchor} in {target.name}")
    problems += [f"{what}: {target.name} has no section {n} (a heading '## {n}. ...')" for n in sections
                 if n not in numbers]
    return problems


def _sections(match: re.Match) -> list[str]:
    first, last = match.group(1), match.group(2)
    if last and first.isdigit():
        return [str(n) for n in range(int(first), int(last) + 1)]
    return [first]


def line_problems(line: str, citing: Path, root: Path = REPO) -> list[str]:
    """Every reference of one line that does not resolve, worded with what is missing."""
    problems = [f"{m.group(0)!r}: a document outside the repo; cite docs/spec.md or docs/engineering.md"
                for m in OUTSIDE.finditer(line)]
    refs: list[tuple[int, Path | None]] = []  # (end position, target) of each file named on the line
    for match in LINK.finditer(line) if citing.suffix == ".md" else ():
        target = match.group(1)
        if re.match(r"[a-z]+:", target):  # http:, https:, mailto:
            continue
        path_part, _, anchor = target.partition("#")
        resolved = (root / citing.relative_to(root)).resolve() if not path_part else resolve(path_part, citing, root)
        if path_part and not path_part.endswith(".md"):
            problems += [] if resolved or (citing.parent / path_part).exists() else [f"{target!r}: no such path"]
            continue
        problems += _check_target(resolved, repr(target), anchor, [])
        refs.append((match.end(), resolved))
    for match in MD_PATH.finditer(line):
        if any(match.start() >= start and match.end() <= end for start, end in
               ((m.start(), m.end()) for m in LINK.finditer(line))) and citing.suffix == ".md":
            continue  # a link's target, checked above
        resolved = resolve(match.group(1), citing, root)
        problems += _check_target(resolved, repr(match.group(0)), (match.group(2) or "#")[1:], [])
        refs.append((match.end(), resolved))
    for match in SECTION.finditer(line):
        before = [target for end, target in refs if end <= match.start()]
        if before:
            target = before[-1]
        elif citing.suffix == ".md":
            target = citing.resolve()
        else:
            problems.append(f"{match.group(0)!r}: a section with no file; write docs/<file>.md {match.group(0)}")
            continue
        if target is not None:
            problems += _check_target(target, repr(match.group(0)), "", _sections(match))
    return problems


def reference_problems(root: Path = REPO) -> list[str]:
    problems = []
    for path in scanned_files(root):
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            problems += [f"{path.relative_to(root)}:{number}: {p}" for p in line_problems(line, path, root)]
    return problems


def test_every_reference_resolves_to_a_file_and_section_of_the_repo():
    problems = reference_problems()
    assert not problems, f"{len(problems)} references that a clone cannot follow:\n" + "\n".join(problems)


def test_the_reader_sees_each_kind_of_broken_reference(tmp_path):
    """The checker itself, on a small tree whose good and bad references are known."""
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "spec.md").write_text("# Spec\n\n## 1. Setting\n\n## 4. Advantages (Eqs. 6-7)\n")
    (tmp_path / "docs" / "guide.md").write_text("# Guide\n\nSee [the spec](spec.md#4-advantages-eqs-6-7), spec.md §4.\n"
                                                "Below (§1) and [missing](spec.md#nope).\n\n## 1. One\n")
    (tmp_path / "code.py").write_text('"""Eq. 7 (docs/spec.md §4, §1); bad: docs/spec.md §9, HACPO_SPEC §4, §2,\n'
                                      'DESIGN §3, docs/gone.md, docs/spec.md#nope."""\n')
    problems = reference_problems(tmp_path)
    text = "\n".join(problems)
    assert "guide.md:4: '[missing](spec.md#nope)'" not in text  # worded by its target, not its text
    assert "docs/guide.md:4: 'spec.md#nope': no heading with the anchor #nope" in text
    assert "code.py:1: '§9': spec.md has no section 9" in text
    assert "code.py:1: 'HACPO_SPEC'" in text and "code.py:2: 'DESIGN §'" in text
    assert "code.py:1: '§2': spec.md has no section 2" in text  # the nearest file before it on the line
    assert "code.py:2: 'docs/gone.md': no such file in the repo" in text
    assert "code.py:2: 'docs/spec.md#nope': no heading with the anchor #nope" in text
    assert "code.py:2: '§3': a section with no file" in text
    assert len(problems) == 8, text


# ---- docstrings that say what the code has


def _module_docstring(path: Path) -> str:
    return ast.get_docstring(ast.parse(path.read_text())) or ""


def test_the_package_docstring_names_every_module():
    package = REPO / "hacrl_lightning"
    modules = {p.stem for p in package.glob("*.py") if p.stem != "__init__"}
    modules |= {p.parent.name for p in package.glob("*/__init__.py")}
    named = set(re.findall(r"`(\w+)`", _module_docstring(package / "__init__.py")))
    assert not modules - named, f"hacrl_lightning/__init__.py's docstring does not name {sorted(modules - named)}"


def test_the_callbacks_docstring_names_every_callback():
    folder = REPO / "hacrl_lightning" / "callbacks"
    classes = {node.name for path in folder.glob("*.py") for node in ast.parse(path.read_text()).body
               if isinstance(node, ast.ClassDef) and any(ast.unparse(b).endswith("Callback") for b in node.bases)}
    named = set(re.findall(r"`(\w+)`", _module_docstring(folder / "__init__.py")))
    assert len(classes) >= 9 and not classes - named, f"callbacks/__init__.py does not name {sorted(classes - named)}"


def test_every_algorithm_setting_has_a_docstring():
    """Each field of `AlgorithmConfig` is followed by its docstring (what it does, its values)."""
    tree = ast.parse((REPO / "hacrl_lightning" / "config.py").read_text())
    body = next(node for node in tree.body if isinstance(node, ast.ClassDef) and node.name == "AlgorithmConfig").body
    fields = [(i, node.target.id) for i, node in enumerate(body) if isinstance(node, ast.AnnAssign)]
    bare = [name for i, name in fields if not (i + 1 < len(body) and isinstance(body[i + 1], ast.Expr)
                                               and isinstance(body[i + 1].value, ast.Constant)
                                               and isinstance(body[i + 1].value.value, str))]
    assert len(fields) >= 25 and not bare, f"AlgorithmConfig fields without a docstring: {bare}"


# ---- backticked names that say what the code has


NAME = re.compile(r"`([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+)(?:\(\))?`")
"""A backticked dotted name (`preflight.check_run`, `HACRLModule.update_learner`, `callbacks.checkpoint.damage`)."""
FILE_SUFFIXES = {"py", "md", "yaml", "yml", "json", "jsonl", "parquet", "txt", "csv", "ckpt", "pt", "log", "png", "sh",
                 "safetensors", "toml", "cfg", "tmp", "partial", "damaged", "old", "lock", "jinja", "whl", "distcp",
                 "metadata", "gz", "bin", "so", "html", "gguf", "zip"}


def _attributes(node: ast.ClassDef) -> set[str]:
    """Names a class defines: methods, class-level assignments and fields, and `self.<name> = ...` in its methods."""
    names = set()
    for item in node.body:
        if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(item.name)
        elif isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
            names.add(item.target.id)
        elif isinstance(item, ast.Assign):
            names |= {t.id for t in item.targets if isinstance(t, ast.Name)}
    for sub in ast.walk(node):
        targets = sub.targets if isinstance(sub, ast.Assign) else [sub.target] if isinstance(sub, (ast.AnnAssign,
                                                                                                 ast.AugAssign)) else []
        names |= {t.attr for t in targets if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name)
                  and t.value.id == "self"}
    return names


@lru_cache(maxsize=None)
def package_index(root: Path = REPO) -> tuple[dict[str, dict], dict[str, list[tuple[str, set[str], list[str]]]]]:
    """(dotted module path -> {name: class attributes or None}, class name -> [(module, attributes, bases)]),
    read by ast from hacrl_lightning/ and scripts/."""
    modules: dict[str, dict] = {}
    classes: dict[str, list] = {}
    for folder in ("hacrl_lightning", "scripts"):
        for path in sorted((root / folder).rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            dotted = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            tree = ast.parse(path.read_text())
            names: dict[str, set | None] = {}
            for node in tree.body:
                if isinstance(node, ast.ClassDef):
                    attributes = _attributes(node)
                    names[node.name] = attributes
                    classes.setdefault(node.name, []).append((dotted, attributes,
                                                              [ast.unparse(b) for b in node.bases]))
                elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    names[node.name] = None
                elif isinstance(node, (ast.Assign, ast.AnnAssign)):
                    for target in (node.targets if isinstance(node, ast.Assign) else [node.target]):
                        names.update({t.id: None for t in ast.walk(target) if isinstance(t, ast.Name)})
                elif isinstance(node, (ast.Import, ast.ImportFrom)):
                    names.update({(a.asname or a.name).split(".")[0]: None for a in node.names})
                elif isinstance(node, (ast.If, ast.Try)):  # names bound under a guard
                    for sub in ast.walk(node):
                        if isinstance(sub, (ast.FunctionDef, ast.ClassDef)):
                            names[sub.name] = None
                        elif isinstance(sub, (ast.Import, ast.ImportFrom)):
                            names.update({(a.asname or a.name).split(".")[0]: None for a in sub.names})
                        elif isinstance(sub, ast.Assign):
                            names.update({t.id: None for t in sub.targets if isinstance(t, ast.Name)})
            modules[dotted] = names
            if dotted.startswith("hacrl_lightning."):
                modules.setdefault(dotted.removeprefix("hacrl_lightning."), names)
    return modules, classes


def _class_has(name: str, attribute: str, root: Path, seen: frozenset = frozenset()) -> bool | None:
    """Whether a package class `name` (or a package base of it) defines `attribute`; where a base outside the
    package (Lightning's, torch's) could, the class itself is imported and asked (None: it cannot be)."""
    found = _class_has_by_ast(name, attribute, root, seen)
    if found is not None or root != REPO:
        return found
    import importlib

    for module, _, _ in package_index(root)[1].get(name, []):
        try:
            cls = getattr(importlib.import_module(module), name)
        except Exception:  # noqa: BLE001 - a module that needs what this machine lacks (vLLM)
            return None
        if hasattr(cls, attribute):
            return True
    return False


def _class_has_by_ast(name: str, attribute: str, root: Path, seen: frozenset = frozenset()) -> bool | None:
    _, classes = package_index(root)
    outside = False
    for _, attributes, bases in classes.get(name, []):
        if attribute in attributes:
            return True
        for base in bases:
            short = base.split(".")[-1]
            if short in classes and short not in seen:
                found = _class_has_by_ast(short, attribute, root, seen | {name})
                if found:
                    return True
                outside = outside or found is None
            elif short not in ("object", "Protocol", "Exception", "ValueError", "RuntimeError", "BaseException",
                               "NamedTuple", "Enum", "str", "dict", "list", "tuple", "LookupError", "KeyError",
                               "OSError", "Generic"):
                outside = True
    return None if outside else False


def _config_key(parts: list[str]) -> bool:
    """`data.eval_size`, `agents.tiny_a.lr`, `trainer.steps`: a key of the training config (`agents.<any key>`)."""
    from dataclasses import is_dataclass
    from typing import get_type_hints

    from hacrl_lightning.config import AgentConfig, TrainConfig

    node, rest = TrainConfig, list(parts)
    while rest and is_dataclass(node):
        hints = get_type_hints(node)
        if rest[0] not in hints:
            return False
        name = rest.pop(0)
        if name == "agents":
            if len(rest) <= 1:
                return True
            node, rest = AgentConfig, rest[1:]
        else:
            node = hints[name]
    return not rest or not is_dataclass(node) and getattr(node, "__origin__", None) is dict


def name_problem(dotted: str, root: Path = REPO) -> str | None:
    """Why a backticked `dotted` name that points into the package does not exist there (None: it does, or it
    is not the package's: `torch.load`, `cfg.trainer`, `config.yaml`)."""
    parts = dotted.split(".")
    if parts[-1] in FILE_SUFFIXES:
        return None
    modules, classes = package_index(root)
    if _config_key(parts):
        return None
    parts = parts[1:] if parts[0] == "hacrl_lightning" and len(parts) > 1 else parts
    for cut in range(len(parts) - 1, 0, -1):  # the longest prefix that names a module
        module = ".".join(parts[:cut])
        if module in modules:
            rest = parts[cut:]
            if rest[0] not in modules[module]:
                sub = f"{module}.{rest[0]}"
                return None if sub in modules else f"{module} has no {rest[0]}"
            attributes = modules[module][rest[0]]
            if len(rest) > 1 and attributes is not None and rest[1] not in attributes and \
                    _class_has(rest[0], rest[1], root) is False:
                return f"{module}.{rest[0]} has no {rest[1]}"
            return None
    if parts[0] in classes and len(parts) > 1 and _class_has(parts[0], parts[1], root) is False:
        return f"class {parts[0]} has no {parts[1]}"
    return None


def dead_names(root: Path = REPO) -> list[str]:
    problems = []
    for path in scanned_files(root):
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            for match in NAME.finditer(line):
                why = name_problem(match.group(1), root)
                if why:
                    problems.append(f"{path.relative_to(root)}:{number}: `{match.group(1)}`: {why}")
    return problems


def test_every_backticked_name_of_the_package_exists():
    problems = dead_names()
    assert not problems, f"{len(problems)} backticked names the code does not have:\n" + "\n".join(problems)


def test_the_name_checker_finds_a_planted_dead_name(tmp_path):
    package = tmp_path / "hacrl_lightning"
    package.mkdir()
    (tmp_path / "scripts").mkdir()
    (package / "__init__.py").write_text("")
    (package / "preflight.py").write_text("def check_run():\n    pass\n\n\nclass Holder:\n    def __init__(self):\n"
                                          "        self.kept = 1\n\n    def lower(self):\n        pass\n")
    (tmp_path / "doc.md").write_text("`preflight.check_run`, `Holder.lower`, `Holder.kept`, `config.yaml`, "
                                     "`torch.load`\n`preflight.resume_problems` and `Holder._update_learner`\n")
    assert dead_names(tmp_path) == ["doc.md:2: `preflight.resume_problems`: preflight has no resume_problems",
                                    "doc.md:2: `Holder._update_learner`: class Holder has no _update_learner"]


# ---- features and dates, not a tracker's numbers

ISSUE_CITATION = re.compile(r"\bissues? #?\d+|(?<![\w&#])#\d{2}\b", re.I)
"""A tracker's issue number ("issue" and a number, "issues" and one, "#" and two digits): a reader of the repo
cannot look it up; the text names the feature and its date instead ("the zoo's portable builds (2026-11-25)")."""
CITATION_PLACES = ("docs", "README.md", "hacrl_lightning", "scripts", "tests", "configs", "agents")
RECORDED = ("docs/gpu/",)
"""Reports the GPU check wrote, kept byte-identical as they were recorded."""


def issue_citations(root: Path = REPO) -> list[str]:
    """`file:line: 'the citation'` for each tracker number in the docs, the README, the package, scripts, tests,
    configs and agent presets (this file included: its pattern is written so that it does not cite one)."""
    own = Path(__file__).resolve()
    files = scanned_files(root) + ([own] if root == REPO else [])
    problems = []
    for path in files:
        relative = path.relative_to(root).as_posix()
        if relative.split("/")[0] not in CITATION_PLACES or relative.startswith(RECORDED):
            continue
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            problems += [f"{relative}:{number}: {match.group(0)!r}" for match in ISSUE_CITATION.finditer(line)]
    return problems


def test_docs_and_code_name_features_and_dates_not_issue_numbers():
    problems = issue_citations()
    assert not problems, (f"{len(problems)} tracker numbers a reader cannot look up; name the feature and its date "
                          "instead, e.g. \"the zoo's portable builds (2026-11-25)\":\n" + "\n".join(problems))


def test_the_citation_checker_names_file_and_line_and_skips_recorded_reports(tmp_path):
    one, two, hashed = "issue" + " 24", "issues" + " 17", "#" + "36"  # built here, so that this file cites none
    for folder in ("docs/gpu/2026-11-27_1754_H100", "hacrl_lightning", "notes"):
        (tmp_path / folder).mkdir(parents=True)
    (tmp_path / "docs" / "guide.md").write_text(f"# Guide\n\nBuilt in {one.title()}, see {hashed} and {two}.\n"
                                                "## 8. Color #ff0000, 2026-11-25, §3, 24 issues\n")
    (tmp_path / "docs" / "gpu" / "2026-11-27_1754_H100" / "gpu_check.md").write_text(f"{one}\n")
    (tmp_path / "hacrl_lightning" / "zoo.py").write_text(f'"""Heads of 32 ({one}, item 6)."""\n')
    (tmp_path / "notes" / "todo.md").write_text(f"{one}\n")  # not a place a reader of the repo looks
    assert issue_citations(tmp_path) == [f"docs/guide.md:3: {one.title()!r}", f"docs/guide.md:3: {hashed!r}",
                                         f"docs/guide.md:3: {two!r}", f"hacrl_lightning/zoo.py:1: {one!r}"]


# ---- one numbering of the training step

STEP_LISTS = (("docs/training.md", "## The step, phase by phase"), ("docs/spec.md", "## 7. Algorithm 1: one training step"))
"""Where a step's phases are a numbered list: the code's telling (the one numbering), then the paper's math."""
STEP_CODE = (("hacrl_lightning/module.py", "HACRLModule.training_step"), ("hacrl_lightning/reference.py", "hacpo_step"))
"""The functions whose comments number the phases (`# 5. Fixed inputs: ...`)."""
PHASE_ITEM = re.compile(r"^(\d+)\.\s+\*\*([^*]+)\*\*")
PHASE_COMMENT = re.compile(r"^#\s*(\d+)\.\s+(.*)")
COUNT_WORDS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven", "twelve")


def phase_list(text: str, heading: str) -> tuple[str, list[tuple[int, str]]] | None:
    """(the section's text, its numbered phases `N. **Name**` as (N, Name)) under `heading`, up to the next
    heading; code fences skipped. None: no such heading."""
    lines = text.splitlines()
    if heading not in lines:
        return None
    section, items, fenced = [], [], False
    for line in lines[lines.index(heading) + 1:]:
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and re.match(r"#{1,6}\s", line):
            break
        elif not fenced and (match := PHASE_ITEM.match(line)):
            items.append((int(match.group(1)), match.group(2).strip()))
        section.append(line)
    return "\n".join(section), items


def phase_comments(source: str, qualname: str) -> list[tuple[int, str]] | None:
    """The comments `# N. text` of function `qualname` ("Class.method" or "function"), as (N, text) in source
    order, from its def to the next definition beside it (a comment after its last statement counts). None: no
    such function."""
    tree = ast.parse(source)
    body, first, last = tree.body, 0, len(source.splitlines())
    for part in qualname.split("."):
        for i, item in enumerate(body):
            if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and item.name == part:
                if i + 1 < len(body):
                    after = body[i + 1]
                    last = min([after.lineno] + [d.lineno for d in getattr(after, "decorator_list", [])]) - 1
                body, first = item.body, item.lineno
                break
        else:
            return None
    comments = [(token.start[0], token.string) for token in tokenize.generate_tokens(io.StringIO(source).readline)
                if token.type == tokenize.COMMENT]
    return [(int(match.group(1)), match.group(2)) for row, text in comments
            if first <= row <= last and (match := PHASE_COMMENT.match(text))]


def step_numbering_problems(root: Path = REPO) -> list[str]:
    """Where the step's numbering differs from docs/training.md's list of phases (1, 2, ..., at least 8): the
    list of spec.md's section 7 (the same numbers and names, and its count in words, "the same nine"), and the
    `# N. Name` comments of `HACRLModule.training_step` and `reference.hacpo_step` (each number once, in order,
    its text starting with the phase's name)."""
    (path, heading), (spec_path, spec_heading) = STEP_LISTS
    found = phase_list((root / path).read_text(), heading)
    phases = found[1] if found else []
    numbers = [number for number, _ in phases]
    if len(phases) < 8 or numbers != list(range(1, len(phases) + 1)):
        return [f"{path}: no list of phases numbered 1, 2, ... under {heading!r} (found {numbers})"]
    problems = []
    spec = phase_list((root / spec_path).read_text(), spec_heading)
    if spec is None or spec[1] != phases:
        problems.append(f"{spec_path}: the phases under {spec_heading!r} are {spec and spec[1]}, not {path}'s {phases}")
    elif len(phases) >= len(COUNT_WORDS) or f"the same {COUNT_WORDS[len(phases)]}" not in spec[0]:
        problems.append(f"{spec_path}: section 7 does not say its count, \"the same {len(phases)} phases\" in words")
    for code_path, qualname in STEP_CODE:
        comments = phase_comments((root / code_path).read_text(), qualname)
        if comments is None:
            problems.append(f"{code_path}: no {qualname}")
        elif [number for number, _ in comments] != numbers:
            problems.append(f"{code_path}: {qualname}'s phase comments are numbered {[n for n, _ in comments]}, "
                            f"{path}'s phases {numbers}")
        else:
            problems += [f"{code_path}: {qualname}'s comment {number}. is {text!r}, {path}'s phase {number} is {name!r}"
                         for (number, name), (_, text) in zip(phases, comments) if not text.lower().startswith(name.lower())]
    return problems


def test_the_training_step_is_numbered_one_way():
    """docs/training.md's numbered phases are the one numbering of a step: spec.md's section 7 numbers the same
    phases, and the comments of the module's `training_step` and the reference's `hacpo_step` carry each number
    once, in order."""
    problems = step_numbering_problems()
    assert not problems, "the step is numbered differently in:\n" + "\n".join(problems)


def test_the_step_numbering_check_fails_where_one_place_is_renumbered(tmp_path):
    """The checker on copies of the four places, each time with one of them changed."""
    places = [path for path, _ in STEP_LISTS + STEP_CODE]

    def copy(change: str, old: str, new: str) -> list[str]:
        root = tmp_path / f"tree{len(list(tmp_path.iterdir()))}"
        for place in places:
            text = (REPO / place).read_text()
            if place == change:
                assert old in text, f"{place} no longer holds {old!r}: update this test"
                text = text.replace(old, new, 1)
            (root / place).parent.mkdir(parents=True, exist_ok=True)
            (root / place).write_text(text)
        return step_numbering_problems(root)

    assert copy("", "", "") == []
    renumbered = copy("hacrl_lightning/module.py", "# 6. Advantages", "# 7. Advantages")
    assert len(renumbered) == 1 and renumbered[0].startswith("hacrl_lightning/module.py: HACRLModule.training_step's "
                                                             "phase comments are numbered [1, 2, 3, 4, 5, 7, 7, 8, 9]")
    renamed = copy("hacrl_lightning/reference.py", "# 3. Reward", "# 3. Scoring")
    assert len(renamed) == 1 and "reference.py: hacpo_step's comment 3. is 'Scoring" in renamed[0]
    spec = copy("docs/spec.md", "6. **Advantages**", "7. **Advantages**")
    assert len(spec) == 1 and spec[0].startswith("docs/spec.md: the phases under")
    count = copy("docs/spec.md", "the same nine", "the same eight")
    assert len(count) == 1 and "does not say its count" in count[0]
    added = copy("docs/training.md", "9. **Weight sync**", "10. **Evaluation**: held out.\n9. **Weight sync**")
    assert len(added) == 1 and "no list of phases numbered 1, 2, ..." in added[0]
    more = copy("docs/training.md", "9. **Weight sync**: ", "9. **Weight sync**: x\n10. **Evaluation**: ")
    assert [problem.split(":")[0] for problem in more] == ["docs/spec.md", *[path for path, _ in STEP_CODE]], more
