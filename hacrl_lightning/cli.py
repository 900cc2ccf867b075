"""The command line's configuration: Hydra composition, the only module of the package that imports Hydra.

`compose_config(overrides)` turns command-line overrides into a validated `TrainConfig`, and
`compose_evaluate(overrides)` into a validated `EvaluateConfig`, with the dataclasses of
`hacrl_lightning.config` registered as Hydra's structured-config schema (one composer, `_compose`,
serves both). Every failure (an unknown key or agent, a wrong type, a bad value or name) surfaces
as one `ConfigError` that lists each problem with the key, the value, what is allowed and how to fix it.

An experiment's per-pair values (`pair:`) are resolved into the chosen algorithm here, from the typed
values, by `hacrl_lightning.presets` (`resolve_algorithm`, `composition_problems`); this module only
tells it which keys the command line set, and writes the resolved algorithm back into the DictConfig,
so that what `--cfg job` prints and `config.yaml` saves is what runs.

The scripts use the compose API rather than `@hydra.main`: the working directory never changes,
config paths are absolute (runs work from any directory), and errors are ours to word. The config
tree is the repository's `configs/` (and `agents/`): this module finds it inside the package in a
wheel install (the wheel ships them there) and beside the package in a source checkout or an editable
install (`CONFIG_DIR`). A user's own presets come from folders of theirs (`hydra.searchpath=[file://...]`,
laid out as configs/) or, for agents, from a YAML file's path in `agents=[...]` (`register_agent_files`).
Deliberately not here: any check of the values
(`config`, `presets`, `preflight`) and anything that runs a job (`scripts/`).
"""

from __future__ import annotations

import re
import shlex
from dataclasses import fields, is_dataclass, replace
from pathlib import Path
from typing import Any, Dict, Sequence, get_type_hints

import hydra  # noqa: F401  (registers the ${now:...} resolver)
from hydra import compose, initialize_config_dir
from hydra.core.config_store import ConfigStore
from hydra.core.global_hydra import GlobalHydra
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException
import yaml

import hacrl_lightning.config as schema
from hacrl_lightning.config import AgentConfig, EvaluateConfig, TrainConfig
from hacrl_lightning.errors import UNKNOWN_KEY, ConfigError, Problem, suggest
from hacrl_lightning.files import write_atomically
from hacrl_lightning.preflight import FreeLengths, check_evaluate, check_run, pure_problems, validate, validate_evaluate
from hacrl_lightning.presets import composition_problems, resolve_algorithm
from hacrl_lightning import run_dir as run_dir_module
from hacrl_lightning.run_dir import resume_run_dir
from hacrl_lightning.safe_load import read_yaml, yaml_problem

PACKAGE_DIR = Path(__file__).resolve().parent
REPO_ROOT = PACKAGE_DIR.parent
"""The source tree when the package runs from one (a checkout, an editable install); in a wheel install,
the folder holding the installed package (site-packages), which has no configs/, scripts/ or tests/."""
INSTALLED = (PACKAGE_DIR / "configs" / "train.yaml").is_file()
"""True for a wheel (non-editable) install: the wheel ships configs/, agents/ and scripts/ inside the
package (pyproject.toml, setup.py); False in the source tree, where they stay at the top of the repo."""
CONFIG_DIR = PACKAGE_DIR / "configs" if INSTALLED else REPO_ROOT / "configs"
"""Hydra's primary config folder: `configs/` (its `agents` group is the top-level `agents/`)."""
SCRIPTS_DIR = PACKAGE_DIR / "scripts" if INSTALLED else REPO_ROOT / "scripts"
"""`train.py`, `evaluate.py`, `compare.py`, ...: the jobs' entry functions (`hacrl_lightning.entry`)."""
WORK_DIR = Path.cwd() if INSTALLED else REPO_ROOT
"""Where a job with no output folder of its own writes (`runs/compare/...`): the repo in a checkout,
the working directory of an installed package."""
GROUPS = ("algorithm", "data", "rollout", "trainer", "experiment", "agents")
EVALUATE_DIR = "evaluate"
"""The evaluation config's folder under CONFIG_DIR (`configs/evaluate/evaluate.yaml`)."""


def register_schema() -> None:
    """The typed schemas (`train_schema`, `evaluate_schema`), and the `${repo:<path>}` resolver: a path
    inside this repository, absolute (the CPU smoke preset reads the math fixtures under tests/ from
    any working directory)."""
    ConfigStore.instance().store(name="train_schema", node=TrainConfig)
    ConfigStore.instance().store(name="evaluate_schema", node=EvaluateConfig)
    if not OmegaConf.has_resolver("repo"):
        OmegaConf.register_new_resolver("repo", lambda path: str(REPO_ROOT / path))


def user_config_dirs(overrides: Sequence[str] = ()) -> list[Path]:
    """The user's own config folders: each local `file://` entry of a `hydra.searchpath=[...]` override
    (a folder laid out as configs/: `agents/*.yaml`, `experiment/*.yaml`, ...), relative to the working
    directory; Hydra then composes from them after the shipped configs."""
    dirs: list[Path] = []
    for override in overrides:
        key, _, value = override.partition("=")
        if key.lstrip("+") == "hydra.searchpath":
            entries = [entry.strip(" '\"") for entry in value.strip("[]").split(",") if entry.strip()]
            dirs += [Path(entry[len("file://"):]).expanduser() for entry in entries if entry.startswith("file://")]
    return dirs


def group_options(group: str, user_dirs: Sequence[Path] = ()) -> dict[str, Path]:
    """Option name -> file for a config group (`agents` is the top-level agents/ folder), the user's
    folders (`user_config_dirs`) included; a shipped option wins over a user file of the same name."""
    options: dict[str, Path] = {}
    for folder in [*reversed(list(user_dirs)), CONFIG_DIR]:
        options.update({path.stem: path for path in sorted((folder / group).glob("*.yaml"))})
    return options


def agent_key(option: str, path: Path | None = None) -> str:
    """The key an agent file lands under: its `# @package agents.<key>` line (else the option's name)."""
    path = path or CONFIG_DIR / "agents" / f"{option}.yaml"
    text = path.read_text(errors="replace") if path.exists() else ""  # a file that is not UTF-8: read_yaml says so
    match = re.search(r"^#\s*@package\s+agents\.(\S+)", text, flags=re.M)
    return match.group(1) if match else option


def is_agent_file(option: Any) -> bool:
    """An entry of `agents=[...]` that is a path to a YAML file of the user's rather than a preset's name."""
    return isinstance(option, str) and option.endswith((".yaml", ".yml")) and ("/" in option or Path(option).exists())


def register_agent_files(overrides: Sequence[str]) -> tuple[list[str], list[Problem]]:
    """Agents given as YAML files (`agents=[tiny_a,my_agents/mine.yaml]`): each file is stored as an option
    of the `agents` group (named by its stem; it lands under its `# @package agents.<key>` line, else under
    the stem with dots as underscores) and the override names that option. Returns the rewritten overrides
    and the problems (a missing file; a name that a shipped preset already has)."""
    out: list[str] = []
    problems: list[Problem] = []
    for override in overrides:
        key, sep, value = override.partition("=")
        if key != "agents" or not sep:
            out.append(override)
            continue
        try:
            chosen = OverridesParser.create().parse_overrides([override])[0].value()
        except HydraException:
            out.append(override)  # check_overrides words it
            continue
        if not isinstance(chosen, list) or not any(map(is_agent_file, chosen)):
            out.append(override)
            continue
        names = []
        for option in chosen:
            if not is_agent_file(option):
                names.append(str(option))
                continue
            path = Path(option).expanduser().resolve()
            name = path.stem
            if not path.is_file():
                problems.append(Problem("agents", option, "an existing agent YAML file or a preset name",
                                        f"check the path (relative to {Path.cwd()})"))
            elif name in group_options("agents"):
                problems.append(Problem("agents", option, f"a file whose name is not a shipped preset's ({name})",
                                        f"rename the file, e.g. my_{name}.yaml"))
            else:
                package = f"agents.{agent_key(name.replace('.', '_'), path)}"
                try:
                    node = read_yaml(path, key="agents")
                except ConfigError as err:
                    problems += err.problems
                    continue
                found = agent_file_problems(node, path, package)
                if found:
                    problems += found
                    continue
                ConfigStore.instance().store(group="agents", name=name, node=node, package=package)
                _AGENT_FILES[name] = path
                names.append(name)
        out.append(f"agents=[{','.join(names)}]")
    return out, problems


def agent_file_problems(node: Any, path: Path, package: str) -> list[Problem]:
    """Every problem of an agent file's values (each key checked against `AgentConfig` on its own, so all are
    named at once, as `<package>.<field>` with the file)."""
    if not isinstance(node, DictConfig):
        return [Problem("agents", str(path), "a YAML mapping of agent settings (model: ..., lr: ...)",
                        f"{path.name} holds {type(node).__name__}: write one setting per line")]
    schema, problems = OmegaConf.structured(AgentConfig), []
    values = OmegaConf.to_container(node, resolve=False)
    for field_name, value in values.items():
        try:
            OmegaConf.merge(schema, {field_name: value})
        except OmegaConfBaseException as err:
            found = _problem_from_exception(err)
            problems.append(Problem(f"{package}.{field_name}", found.value, found.allowed, f"{found.fix} (in {path})"))
    return problems


_AGENT_FILES: dict[str, Path] = {}
"""Agent files registered by `register_agent_files` in this process: option name -> path."""


def _schema_leaf(path: list[str]) -> tuple[Any, Problem | None]:
    """The schema type of a dotted override key (e.g. `agents.tiny_b.lr` -> float), or the problem."""
    node: Any = TrainConfig
    depth = 0
    while depth < len(path) and is_dataclass(node):
        part = path[depth]
        hints = get_type_hints(node)
        if part not in hints:
            key = ".".join(path[: depth + 1])
            return None, Problem(key, UNKNOWN_KEY, suggest(part, hints), f"check the spelling of {key!r}")
        node = hints[part]
        if node == Dict[str, AgentConfig]:
            node, depth = AgentConfig, depth + 1  # agents.<key>: the key itself is checked when composing
        elif _list_item(node) is not None and depth + 1 < len(path):  # data.rewards.<i>: a term of the list
            if not path[depth + 1].isdigit():
                key = ".".join(path[: depth + 2])
                return None, Problem(key, path[depth + 1], f"an index of the list {'.'.join(path[: depth + 1])} "
                                     "(0, 1, ...)", f"write {'.'.join(path[: depth + 1])}.0.<setting>=...")
            node, depth = _list_item(node), depth + 1
        depth += 1
    return (node if depth == len(path) else None), None


def _list_item(hint: Any) -> Any:
    """The dataclass of a `List[<dataclass>]` schema field (`data.rewards`: `RewardTerm`), else None."""
    args = getattr(hint, "__args__", ())
    return args[0] if getattr(hint, "__origin__", None) is list and args and is_dataclass(args[0]) else None


def term_problems(key: str, value: Any, cls: type, where: str = "the command line") -> list[Problem]:
    """Every problem of a list of `cls` settings (`data.rewards=[{reward: ..., weight: ...}, ...]`), each named
    by its full key (`data.rewards[1].weight`), with what is allowed and a fix: before Hydra, whose own errors
    name a term's key without its list and index."""
    names = [f.name for f in fields(cls)]
    required = [f.name for f in fields(cls) if f.default is not None and str(f.default) == "???"]
    example = f"{key}=[{{reward: exact_match, weight: 1.0}}]" if key.endswith("rewards") else f"{key}=[{{...}}]"
    if not isinstance(value, (list, tuple)):
        return [Problem(key, value, f"a list of {{{', '.join(names)}}} mappings", f"write a list in brackets, e.g. "
                        f"{shell_word(example)} (from {where})")]
    problems: list[Problem] = []
    for i, term in enumerate(value):
        at = f"{key}[{i}]"
        if not isinstance(term, dict):
            problems.append(Problem(at, term, f"a mapping of {names}", f"write each term as {{reward: <name>, "
                                    f"weight: <number>}}, e.g. {shell_word(example)} (from {where})"
                                    if key.endswith("rewards") else f"write each term as a mapping (from {where})"))
            continue
        for name in term:
            if name not in names:
                problems.append(Problem(f"{at}.{name}", UNKNOWN_KEY, suggest(str(name), names),
                                        f"fix the spelling of {name!r} in term {i} of {key} (from {where})"))
        for name in required:
            if name not in term:
                problems.append(Problem(f"{at}.{name}", "nothing (the term has none)", "a value: every term needs "
                                        f"its {name}", f"add {name}: <value> to term {i} of {key}, e.g. "
                                        f"{shell_word(example)} (from {where})"))
        hints = get_type_hints(cls)
        for name, item in term.items():
            if name in names:
                problem = _type_problem(f"{key}.{i}.{name}", item, hints[name])
                problem = replace(problem, key=f"{at}.{name}") if problem else problem
                problem = problem or \
                    (Problem(f"{at}.{name}", item, "one text (a reward's name, module:function or "
                             "path/to/file.py:function)", f"give term {i} a single {name} (from {where})")
                     if hints[name] is str and isinstance(item, (list, dict)) else None)
                if problem:
                    problems.append(problem)
    return problems


def _type_problem(key: str, value: Any, hint: Any) -> Problem | None:
    """A value that cannot become the field's scalar type (int, float, bool)."""
    ok = {
        bool: lambda v: isinstance(v, bool),
        int: lambda v: isinstance(v, int) and not isinstance(v, bool),
        float: lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    }
    words = {bool: ("true or false", "true"), int: ("an integer", "1"), float: ("a number", "0.5")}
    if hint in ok and value is not None and not ok[hint](value):
        what, example = words[hint]
        return Problem(key, value, what, f"write {what}, e.g. {key}={example}")
    return None


MULTIRUN_FLAGS = ("-m", "--multirun")


def hydra_value(text: str) -> str:
    """`text` written as an override value that Hydra reads back as exactly this string: as it is when it
    parses so, else in single quotes (Hydra's rule: a quote inside, and the backslashes before a quote or
    at the end, escaped with a backslash). A space needs no Hydra quotes; `=`, `,`, `~`, brackets and
    non-ASCII letters do."""
    try:
        (parsed,) = OverridesParser.create().parse_overrides([f"key={text}"])
        if not parsed.is_sweep_override() and parsed.value() == text:
            return text
    except HydraException:
        pass
    return "'" + re.sub(r"(\\*)('|$)", lambda m: m.group(1) * 2 + ("\\'" if m.group(2) else ""), text) + "'"


def shell_word(text: str) -> str:
    """`text` as one word for a POSIX shell: as it is, in single quotes, or in double quotes around single
    quotes (Hydra's) where the shell leaves the text alone in them; else `shlex.quote`."""
    if shlex.quote(text) != text and "'" in text and not any(c in text for c in '"$`\\!'):
        return f'"{text}"'
    return shlex.quote(text)


def shell_override(key: str, value: str) -> str:
    """`key=value` as one shell word that Hydra reads back as `value` (printed commands: `continue with:
    ... resume=...`): Hydra's quoting of the value (`hydra_value`), then the shell's (`shell_word`)."""
    return shell_word(f"{key}={hydra_value(value)}")


run_dir_module.argument_format = shell_override  # the run directory's messages quote as this layer does


def _parses(override: str) -> bool:
    try:
        OverridesParser.create().parse_overrides([override])
    except HydraException:
        return False
    return True


def _unparsable(override: str) -> Problem:
    """The problem of one override Hydra cannot parse: a flag, or a value that needs quoting (how, for this value)."""
    if override.startswith("-"):
        if override in MULTIRUN_FLAGS:
            return Problem("/".join(MULTIRUN_FLAGS), override, "one run per command (no Hydra sweeps)",
                           "to run several methods, seeds or settings use scripts/compare.py "
                           "(e.g. python scripts/compare.py methods=[grpo,hacpo] seeds=[0,1,2]; see its --help)")
        return Problem(override, "an unknown option", "key=value overrides, --cfg job, --help",
                       "see --help; settings are key=value (e.g. trainer.steps=10)")
    key, eq, value = override.partition("=")
    if not eq:
        return Problem("overrides", override, "key=value pairs", f"write {override}=<value>")
    return Problem(key, value, "a value Hydra can read: one without =, ',', ~, brackets or non-ASCII letters, or the "
                   "value quoted", f"quote the value for Hydra and the argument for the shell: {shell_override(key, value)}")


def _sweep(key: str, text: str, values: list) -> Problem:
    """A value with a comma, which Hydra reads as a sweep over several values (a text value: perhaps a comma
    meant as part of it, so how to quote it too)."""
    quote = (f"; for a value that holds a comma, quote it: {shell_override(key, text)}"
             if all(isinstance(v, str) for v in values) else "")
    return Problem(key, text, "one value (a comma makes a Hydra sweep, which a script does not run)",
                   f"to run several values use scripts/compare.py (e.g. seeds=[0,1,2]){quote}")


def check_overrides(overrides: Sequence[str]) -> list[Problem]:
    """Every problem in the command-line overrides that can be seen before composing."""
    problems: list[Problem] = []
    try:
        parsed = OverridesParser.create().parse_overrides(list(overrides))
    except HydraException:
        return [_unparsable(override) for override in overrides if not _parses(override)]
    user_dirs = user_config_dirs(overrides)
    problems += [Problem("hydra.searchpath", f"file://{folder}", "an existing folder laid out as configs/",
                         f"check the path (relative to {Path.cwd()})") for folder in user_dirs if not folder.is_dir()]
    for ov in parsed:
        key = ov.key_or_group
        if key.startswith("hydra") or ov.is_add() or ov.is_delete():
            continue
        if ov.is_sweep_override():
            problems.append(_sweep(key, ov.input_line.partition("=")[2], list(getattr(ov.value(), "list", []))))
            continue
        if key in GROUPS and (CONFIG_DIR / key).is_dir():
            value = ov.value()
            options = {**group_options(key, user_dirs), **(_AGENT_FILES if key == "agents" else {})}
            chosen = value if isinstance(value, list) else [value]
            for name in chosen:
                if name is not None and str(name) not in options:
                    problems.append(Problem(key, name, suggest(str(name), options),
                                            f"add {key}/{name}.yaml to a folder of yours given by "
                                            f"hydra.searchpath=[file://<folder>] or pick a known {key} preset"))
            keys = [agent_key(str(name), options.get(str(name))) for name in value] if isinstance(value, list) else []
            if key == "agents" and len(set(keys)) != len(keys):
                problems.append(Problem("agents", value, "each agent once", "remove the duplicate agent"))
            continue
        hint, problem = _schema_leaf(key.split("."))
        if problem is None and _list_item(hint) is not None:  # a whole list of terms (data.rewards=[...])
            problems += term_problems(key, ov.value(), _list_item(hint))
            continue
        problem = problem or _type_problem(key, ov.value(), hint)
        if problem:
            problems.append(problem)
    return problems


def explicit_keys(overrides: Sequence[str]) -> frozenset[str]:
    """The dotted keys the command line sets (`algorithm.alpha`, `pair.delta`, each key of `pair={...}`);
    choosing a file (`algorithm=grpo`, `experiment=paper_state`) sets none."""
    try:
        parsed = OverridesParser.create().parse_overrides(list(overrides))
    except HydraException:
        return frozenset()  # check_overrides reports it
    keys = set()
    for ov in parsed:
        key = ov.key_or_group
        if ov.is_delete() or key in GROUPS:
            continue
        value = ov.value()
        keys |= {f"{key}.{sub}" for sub in value} if isinstance(value, dict) else {key}
    return frozenset(keys)


def _problem_from_exception(err: Exception) -> Problem:
    """Word an OmegaConf/Hydra composition error as a Problem (key, value, allowed, fix)."""
    inner = err.__cause__
    text = f"{err}\n{inner or ''}"
    key = getattr(err, "full_key", None) or getattr(inner, "full_key", None) or ""
    first = text.strip().splitlines()[0] if text.strip() else type(err).__name__
    match = re.search(r"Key '([^']+)' not in '(\w+)'", text)
    if match:
        cls = getattr(schema, match.group(2), None)
        names = [f.name for f in fields(cls)] if cls else []
        return Problem(key or match.group(1), UNKNOWN_KEY, suggest(match.group(1), names),
                       "fix the spelling in the YAML file or on the command line")
    match = re.search(r"Key '([^']+)' is not in struct", text)
    if match and key.startswith("agents."):
        return Problem(key, match.group(1), "an agent selected in this run",
                       f"select it first, e.g. agents=[...,{match.group(1)}], then override {key}.<field>")
    match = re.search(r"Value '(.*?)'(?: of type '\w+')? could not be converted to (\w+)", text)
    if match:
        kind = match.group(2).lower()
        return Problem(key or "?", match.group(1), f"a value of type {match.group(2)}",
                       f"give {key or 'the key'} {'an' if kind[0] in 'aeiou' else 'a'} {kind}")
    return _shape_problem(key, text) or Problem(
        key or "config", first, "a configuration that composes",
        f"check {key or 'the value'} against its setting's type and default: scripts/train.py --help "
        f"{_help_topic(key)} (or --cfg job to see what composed)")


def _help_topic(key: str) -> str:
    """The `--help <topic>` (`TRAIN_SETTINGS`) that describes `key`."""
    parts = key.replace("[", ".").split(".")
    if parts[0] in ("agents", "agent_defaults"):
        return "lora" if "lora" in parts else "agents"
    return parts[0] if parts[0] in ("algorithm", "pair", "rollout", "data", "trainer") else "run"


def _shape_problem(key: str, text: str) -> Problem | None:
    """A value of the wrong shape (text for a list, a mapping or a section; a list for a text; an index past a
    list's end), worded with the full key, what the setting holds and how to write it."""
    setting = key or "the setting"
    match = re.search(r"(?:Invalid type assigned|Merge error): (\w+) is not a subclass of (\w+)\. value: (.*)", text)
    if match:
        cls = getattr(schema, match.group(2), None)
        names = [f.name for f in fields(cls)] if cls is not None and is_dataclass(cls) else []
        index = re.fullmatch(r"(.+)\[(\d+)\]", key)
        if index and match.group(1) == "dict" and match.group(3).strip() in ("{}", ""):
            return Problem(key, f"term {index.group(2)}, which the list does not hold", f"an index of the list "
                           f"{index.group(1)} as composed so far (its terms come from the experiment, or a whole list "
                           "on the command line)", f"write the whole list on the command line: {index.group(1)}="
                           "[{reward: exact_match, weight: 1.0}, ...] (an index adds no term)")
        return Problem(key, match.group(3).strip(), f"a mapping of {match.group(2)}'s settings {names}",
                       f"write {setting} as {{<setting>: <value>}}, or set one of them: {setting}.<setting>=<value>")
    if re.search(r"is not a ListConfig, list or tuple", text):
        return Problem(key, "a single value", "a list", f"write the list in brackets, e.g. {setting}=[a,b]")
    match = re.search(r"Cannot assign (\w+) to Dict\[", text)
    if match:
        return Problem(key, f"a {match.group(1)}", "a mapping of names to values",
                       f"write {{<name>: <value>}} in braces, or set one entry: {setting}.<name>=<value>")
    match = re.search(r"Value '(.*?)' is not a valid bool", text)
    if match:
        return Problem(key, match.group(1), "true or false", f"write {setting}=true or {setting}=false")
    match = re.search(r"Cannot convert '(\w+)' to string: '(.*)'$", text, flags=re.M)
    if match:
        return Problem(key, match.group(2), "one text, not a list or mapping", f"give {setting} a single value")
    match = re.search(r"missing mandatory value: (\w+)", text)
    if match:
        return Problem(key, "nothing (no value)", f"a value: {setting} is required", f"set {setting}=<value>")
    return None


def _compose(config_dir: Path, config_name: str, overrides: Sequence[str]) -> DictConfig:
    """Compose `config_name` from `config_dir` with the schemas registered; raises ConfigError on failure."""
    register_schema()
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(config_dir), version_base="1.3"):
            return compose(config_name=config_name, overrides=list(overrides))
    except (HydraException, OmegaConfBaseException) as err:
        raise ConfigError([_problem_from_exception(err)]) from None
    except (yaml.YAMLError, UnicodeDecodeError) as err:  # a config file of the user's (hydra.searchpath)
        raise ConfigError([yaml_problem(err, key="config")]) from None


def compose_dictconfig(overrides: Sequence[str] = ()) -> DictConfig:
    """The composed (unvalidated) training DictConfig; raises ConfigError for override and composition problems."""
    return _compose_train(overrides)[0]


def _compose_train(overrides: Sequence[str]) -> tuple[DictConfig, frozenset[str]]:
    """`compose_dictconfig`, and the `agents.<key>.<setting>` keys `agent_defaults` filled (`apply_agent_defaults`)."""
    register_schema()
    overrides, problems = register_agent_files(overrides)
    # `agent_defaults` is a free dict: agent_defaults.<setting>=... adds the key or replaces an experiment's
    # (Hydra's `++` prefix, added for the user)
    overrides = [f"++{o}" if o.startswith("agent_defaults.") else o for o in overrides]
    try:
        problems += check_overrides(overrides)
        problems += _experiment_term_problems(overrides)
        if problems:
            raise ConfigError(problems)
        dcfg = _compose(CONFIG_DIR, "train", overrides)
        return dcfg, apply_agent_defaults(dcfg, overrides)
    finally:  # a user's agent files serve this composition only (an `agents` group would turn evaluate.py's
        forget_agent_files()  # `agents=[...]` list into a group choice in the same process)


def _experiment_term_problems(overrides: Sequence[str]) -> list[Problem]:
    """The chosen experiment's `data.rewards` terms (`term_problems`), named by full key with the file, unless the
    command line replaces the whole list."""
    data = _experiment_values(overrides).get("data")
    if not isinstance(data, dict) or "rewards" not in data or "data.rewards" in explicit_keys(overrides):
        return []
    return term_problems("data.rewards", data["rewards"], schema.RewardTerm, where=str(_experiment_file(overrides)))


def agent_preset(name: str) -> AgentConfig | None:
    """The `AgentConfig` of the shipped agent preset `name` (`agents/<name>.yaml`), or None when there is none
    (`evaluate.py agents=[smollm2_135m_instruct]`: a preset's model with its lengths, template and settings)."""
    path = group_options("agents").get(name)
    if path is None:
        return None
    node = read_yaml(path, key="agents") or {}
    return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(AgentConfig), node))


def _agent_file_keys(overrides: Sequence[str]) -> dict[str, set[str]]:
    """Agent key -> the settings its own file sets, for every agent file this composition can pick (the
    shipped presets, the user's folders' and the files given by path)."""
    files = {**group_options("agents", user_config_dirs(overrides)), **_AGENT_FILES}
    keys: dict[str, set[str]] = {}
    for option, path in files.items():
        try:
            node = read_yaml(path, key="agents")
        except ConfigError:
            continue  # composing would have failed on it already
        keys[agent_key(option.replace(".", "_") if option in _AGENT_FILES else option, path)] = set(node or {})
    return keys


def _experiment_agent_keys(overrides: Sequence[str]) -> set[str]:
    """`agents.<key>.<setting>` keys the chosen experiment file (`experiment=<name>`) sets itself."""
    path = _experiment_file(overrides)
    if path is None:
        return set()
    agents = (read_yaml(path, key="experiment") or {}).get("agents") or {}
    return {f"agents.{key}.{name}" for key, values in agents.items() if isinstance(values, dict) for name in values}


def apply_agent_defaults(dcfg: DictConfig, overrides: Sequence[str]) -> frozenset[str]:
    """Give every agent of the list the `agent_defaults` it does not set itself (its file, the command line
    and the experiment's `agents.<key>.*` win), and refuse an `agents.<key>` that names no agent of the list
    (per-agent values keyed by a name the list does not hold), naming the key and the list. Returns the
    `agents.<key>.<setting>` keys it filled."""
    agents = dcfg.agents
    listed = [key for key in agents if not OmegaConf.is_missing(agents[key], "model")]
    shared = OmegaConf.to_container(dcfg.agent_defaults, resolve=False) if "agent_defaults" in dcfg else {}
    # the agent files are read only when needed: an agent without a model, or settings for every agent
    own = _agent_file_keys(overrides) if shared or len(listed) < len(agents) else {}
    # no model: settings keyed by an agent the list lacks, unless it is an agent file without `model:` (the
    # schema says that one itself)
    strays = [key for key in agents if key not in listed and not (key in own and "model" not in own[key])]
    if strays:
        raise ConfigError([Problem(f"agents.{key}", "settings for an agent the list does not hold",
                                   f"settings of an agent of the list {listed}",
                                   f"add it to the list (agents=[...,{key}]) or drop agents.{key}.*; settings for every "
                                   "agent go under agent_defaults") for key in strays])
    if not shared:
        return frozenset()
    names = [f.name for f in fields(AgentConfig)]
    unknown = [key for key in shared if key not in names]
    if unknown:
        raise ConfigError([Problem(f"agent_defaults.{key}", UNKNOWN_KEY, suggest(key, names),
                                   "agent_defaults holds agents.<key>.* settings; fix the spelling") for key in unknown])
    given = explicit_keys(overrides)
    where = {name: "on the command line" if any(k == f"agent_defaults.{name}" or k.startswith(f"agent_defaults.{name}.")
                                                for k in given) else f"in {_experiment_file(overrides) or 'a config file'}"
             for name in shared}
    problems = agent_defaults_problems(shared, where)
    if problems:  # each value checked once, where it is written, whether or not an agent takes it
        raise ConfigError(problems)
    explicit = given | _experiment_agent_keys(overrides)
    filled = set()
    for key in listed:
        for name, value in shared.items():
            if name not in own.get(key, set()) and f"agents.{key}.{name}" not in explicit:
                try:
                    if isinstance(value, dict) and isinstance(agents[key].get(name), DictConfig):
                        agents[key][name].merge_with(value)  # agent_defaults.lora.rank=8: one setting of lora
                    else:
                        agents[key][name] = value
                except OmegaConfBaseException as err:
                    raise ConfigError([_problem_from_exception(err)]) from None
                filled.add(f"agents.{key}.{name}")
    return frozenset(filled)


def agent_defaults_problems(shared: dict, where: dict[str, str]) -> list[Problem]:
    """Every `agent_defaults` value that no agent could take (each checked against `AgentConfig` on its own),
    named `agent_defaults.<setting>` with where it is written (`where`: setting -> the command line or a file)."""
    agent_schema, problems = OmegaConf.structured(AgentConfig), []
    for name, value in shared.items():
        try:
            OmegaConf.merge(agent_schema, {name: value})
        except OmegaConfBaseException as err:
            found = _problem_from_exception(err)
            inner = getattr(err, "full_key", "") or name
            key = f"agent_defaults.{inner}"
            fix = f"fix the spelling of {key}" if found.value is UNKNOWN_KEY else \
                found.fix.replace(str(found.key), key) if found.key else found.fix.replace("the setting", key)
            problems.append(Problem(key, found.value, found.allowed, f"{fix} ({where.get(name, 'in a config file')})"))
    return problems


def forget_agent_files() -> None:
    """Remove the agent files `register_agent_files` stored in Hydra's ConfigStore."""
    group = ConfigStore.instance().repo.get("agents", {})
    for name in list(_AGENT_FILES):
        group.pop(f"{name}.yaml", None)
        _AGENT_FILES.pop(name)
    if "agents" in ConfigStore.instance().repo and not group:
        del ConfigStore.instance().repo["agents"]


def to_train_config(cfg: DictConfig, *, preflight: bool = False, overrides: Sequence[str] = (),
                    defaulted: frozenset[str] = frozenset()) -> TrainConfig:
    """DictConfig -> resolved, validated TrainConfig (resolving interpolations such as ${now:...}).

    The pair's values are resolved into the algorithm (`overrides`: the command line it was composed
    from, whose explicit keys win and are checked); a composition that cannot be honoured is refused
    with the other problems. On success the resolved algorithm is written back into `cfg`.
    With `resume=` and no `run_dir=` on the command line, the run continues in the resumed run's
    directory (a `run_dir=` of another directory forks the run there; `training.train`).
    Values and names are always checked (`hacrl_lightning.preflight.validate`); `preflight`: also
    files and tokenizers (`preflight.check_run`), all problems in one error; what `scripts/train.py`
    does before any model is loaded. With `data.few_shot` the preflight fits the lengths that no one chose:
    not those of `overrides`, of the experiment, or that `agent_defaults` filled (`defaulted`)."""
    try:
        typed = OmegaConf.to_object(cfg)
    except OmegaConfBaseException as err:
        raise ConfigError([_problem_from_exception(err)]) from None
    explicit = explicit_keys(overrides)
    untrusted = code_setting_problems(typed, explicit, overrides)  # before anything reads a model folder
    if untrusted:
        raise ConfigError(untrusted)
    refused = composition_problems(typed.algorithm, typed.pair, explicit)
    typed.algorithm = resolve_algorithm(typed.algorithm, typed.pair, explicit)
    if refused:  # with the other problems, each key once
        seen = {problem.key for problem in refused}
        raise ConfigError(refused + [problem for problem in pure_problems(typed) if problem.key not in seen])
    if typed.resume and "run_dir" not in explicit:  # a resume continues in its run's directory
        typed.run_dir = cfg.run_dir = str(resume_run_dir(typed.resume))
    if preflight:  # lengths set by a preset, not by the command line or the experiment, may fit data.few_shot
        chosen = explicit | _experiment_agent_keys(overrides) | defaulted  # agent_defaults': a choice too
        free = {name: FreeLengths(prompt=f"agents.{name}.max_prompt_len" not in chosen,
                                  response=f"agents.{name}.max_response_len" not in chosen) for name in typed.agents}
    checked = check_run(typed, free_lengths=free) if preflight else validate(typed)
    cfg.algorithm = OmegaConf.structured(typed.algorithm)  # what is shown and saved is what runs
    for name, agent in typed.agents.items():
        for length in ("max_prompt_len", "max_response_len"):
            if cfg.agents[name][length] != getattr(agent, length):
                cfg.agents[name][length] = getattr(agent, length)
    return checked


CODE_SETTINGS: Dict[str, str] = {
    "data.reward": "data.reward=<module:function or path/to/file.py:function>",
    "data.rewards.*.reward": "data.rewards.<i>.reward=<module:function or file.py:function>, or the whole list "
                             "data.rewards=[...]",
    "agents.*.trust_remote_code": "agents.<key>.trust_remote_code=true, or agent_defaults.trust_remote_code=true",
}
"""Every training setting that can name code that runs (a reward function, a model folder's own `.py` through
transformers' `trust_remote_code`), with the command-line words that admit it (`code_setting_problems`). Such a
setting counts only when the command line says it; from any file (an experiment, an agent file, a data preset, a
run's saved config) it is refused before anything loads. tests/test_trust.py walks the config dataclasses and
requires every field that names code to be here (or in `EVALUATE_CODE_SETTINGS`)."""
EVALUATE_CODE_SETTINGS: Dict[str, str] = {
    "reward": "reward=<module:function or path/to/file.py:function>",
    "trust_remote_code": "trust_remote_code=true",
}
"""`scripts/evaluate.py`'s settings that name code: the same rule (`evaluate_code_problems`)."""


def _experiment_file(overrides: Sequence[str]) -> Path | None:
    """The experiment file the command line chooses (`experiment=<name>`), if any."""
    choice = next((value for key, _, value in (o.partition("=") for o in overrides) if key.lstrip("+") == "experiment"),
                  None)
    return group_options("experiment", user_config_dirs(overrides)).get(choice or "")


def _experiment_values(overrides: Sequence[str]) -> dict:
    """The chosen experiment file's values as written (empty without one, or when it does not read)."""
    path = _experiment_file(overrides)
    try:
        node = read_yaml(path, key="experiment") if path else None
    except ConfigError:
        return {}  # composing said it
    values = OmegaConf.to_container(node, resolve=False) if isinstance(node, DictConfig) else node
    return values if isinstance(values, dict) else {}


def _agent_files(overrides: Sequence[str]) -> dict[str, Path]:
    """Agent key -> the file its settings came from: the presets (shipped and the user's folders) and the files
    given by path in `agents=[...]`."""
    files = {agent_key(option, path): path for option, path in
             group_options("agents", user_config_dirs(overrides)).items()}
    for override in overrides:
        key, _, value = override.partition("=")
        if key == "agents":
            for entry in value.strip("[]").split(","):
                entry = entry.strip(" '\"")
                if is_agent_file(entry):
                    path = Path(entry).expanduser().resolve()
                    files[agent_key(path.stem.replace(".", "_"), path)] = path
    return files


def code_reward_problems(cfg: TrainConfig, explicit: frozenset[str], overrides: Sequence[str] = ()) -> list[Problem]:
    """A reward that runs code of the user's (`module:function`, `file.py:function`) is taken from the command
    line only, never from a config file (an experiment or a saved run someone else wrote): `data.reward=...`,
    the term's own `data.rewards.<i>.reward=...`, or the whole list `data.rewards=[...]` (another key of the list,
    such as `data.rewards.0.weight`, admits nothing)."""
    from hacrl_lightning.preflight import reward_specs
    from hacrl_lightning.rewards.custom import is_code

    experiment = _experiment_file(overrides)
    data = _experiment_values(overrides).get("data") if experiment else None
    problems = []
    for key, spec in reward_specs(cfg):
        index = re.fullmatch(r"data\.rewards\[(\d+)\]\.reward", key)
        admitted = {"data.reward"} if index is None else {"data.rewards", f"data.rewards.{index.group(1)}.reward"}
        if not is_code(spec) or admitted & explicit:
            continue
        field = "reward" if index is None else "rewards"
        where = f" (written in {experiment})" if isinstance(data, dict) and field in data else " (written in a config file)"
        example = f"{key}={hydra_value(spec)}" if index is None else \
            f"data.rewards.{index.group(1)}.reward={hydra_value(spec)}"
        problems.append(Problem(key, spec, f"code named on the command line{where}: a config file names no code that "
                                "runs", f"if you trust that code, add {shell_word(example)} to the command line"))
    return problems


def remote_code_problems(cfg: TrainConfig, explicit: frozenset[str], overrides: Sequence[str] = ()) -> list[Problem]:
    """`trust_remote_code: true` (a model folder's own `.py`, its config.json's `auto_map`, runs) counts only when
    the command line says it: `agents.<key>.trust_remote_code=true`, or `agent_defaults.trust_remote_code=true`
    for every agent. From an experiment, an agent file or any other file it is refused, naming the file."""
    every = "agent_defaults.trust_remote_code" in explicit and cfg.agent_defaults.get("trust_remote_code") is True
    if every:
        return []
    experiment = _experiment_file(overrides)
    values = _experiment_values(overrides) if experiment else {}
    shared = values.get("agent_defaults") if isinstance(values.get("agent_defaults"), dict) else {}
    own = values.get("agents") if isinstance(values.get("agents"), dict) else {}
    files: dict[str, Path] | None = None
    problems = []
    for name, agent in cfg.agents.items():
        key = f"agents.{name}.trust_remote_code"
        if not agent.trust_remote_code or key in explicit:
            continue
        if isinstance(own.get(name), dict) and "trust_remote_code" in own[name]:
            where = f"written in {experiment}"
        elif "trust_remote_code" in shared:
            where = f"agent_defaults.trust_remote_code in {experiment}"
        else:
            files = _agent_files(overrides) if files is None else files
            where = f"written in {files[name]}" if name in files else "written in a config file"
        problems.append(Problem(key, True, f"true only from this command line ({where}; a file never turns on a "
                                "model's own code)", f"if you trust the code that {agent.model} ships, add {key}=true "
                                "to the command line (or agent_defaults.trust_remote_code=true for every agent); "
                                "else drop trust_remote_code from that file"))
    return problems


def code_setting_problems(cfg: TrainConfig, explicit: frozenset[str], overrides: Sequence[str] = ()) -> list[Problem]:
    """Every setting of `CODE_SETTINGS` that names code without the command line's say (`code_reward_problems`,
    `remote_code_problems`)."""
    return code_reward_problems(cfg, explicit, overrides) + remote_code_problems(cfg, explicit, overrides)


def evaluate_code_problems(cfg: EvaluateConfig, explicit: frozenset[str]) -> list[Problem]:
    """`EVALUATE_CODE_SETTINGS` that name code without the command line's say (a user's config folder could set
    them): the same rule as training's."""
    from hacrl_lightning.rewards.custom import is_code

    problems = []
    if cfg.reward is not None and is_code(cfg.reward) and "reward" not in explicit:
        problems.append(Problem("reward", cfg.reward, "code named on the command line (written in a config file)",
                                f"if you trust that code, add {shell_override('reward', cfg.reward)} to the command line"))
    if cfg.trust_remote_code and "trust_remote_code" not in explicit:
        problems.append(Problem("trust_remote_code", True, "true only from this command line (written in a config "
                                "file)", "if you trust the models' own code, add trust_remote_code=true to the command "
                                "line"))
    return problems


def compose_config(overrides: Sequence[str] = (), *, preflight: bool = False) -> tuple[TrainConfig, DictConfig]:
    """Overrides -> (validated TrainConfig, the DictConfig it came from with the resolved algorithm, for saving)."""
    dcfg, defaulted = _compose_train(overrides)
    return to_train_config(dcfg, preflight=preflight, overrides=overrides, defaulted=defaulted), dcfg


def compose_evaluate(overrides: Sequence[str] = (), *, preflight: bool = False) -> tuple[EvaluateConfig, DictConfig]:
    """Overrides -> (validated EvaluateConfig, its DictConfig), from `configs/evaluate/evaluate.yaml`;
    raises ConfigError listing every problem. `preflight`: also what this machine must have (the
    device, vLLM, hub agents and benchmarks; `preflight.check_evaluate`), as scripts/evaluate.py does."""
    # `files` is a free dict: files.<benchmark>=... adds a key (Hydra's `+` prefix, added for the user)
    overrides = [f"+{o}" if o.startswith("files.") else o for o in overrides]
    unparsable = [_unparsable(override) for override in overrides if not _parses(override)]
    if unparsable:  # a flag (-m), a value to quote: said as for training
        raise ConfigError(unparsable)
    dcfg = _compose(CONFIG_DIR / EVALUATE_DIR, "evaluate", overrides)
    try:
        cfg = OmegaConf.to_object(dcfg)
    except OmegaConfBaseException as err:
        raise ConfigError([_problem_from_exception(err)]) from None
    untrusted = evaluate_code_problems(cfg, explicit_keys([o.lstrip("+") for o in overrides]))
    if untrusted:
        raise ConfigError(untrusted)
    checked = check_evaluate(cfg, presets=set(group_options("agents"))) if preflight else validate_evaluate(cfg)
    return checked, dcfg


def save_resolved(dcfg: DictConfig, run_dir: Path, name: str = "config.yaml") -> Path:
    """Write the resolved config (as `name`) in the run directory, atomically."""
    run_dir.mkdir(parents=True, exist_ok=True)
    return write_atomically(run_dir / name, OmegaConf.to_yaml(dcfg, resolve=True))


TRAIN_SETTINGS = {"agents": (schema.AgentConfig, "agents.<key>."), "lora": (schema.LoraConfig, "agents.<key>.lora."),
                  "algorithm": (schema.AlgorithmConfig, "algorithm."),
                  "pair": (schema.PairConfig, "pair."), "rollout": (schema.RolloutConfig, "rollout."),
                  "data": (schema.DataConfig, "data."), "trainer": (schema.TrainerConfig, "trainer."),
                  "run": (schema.TrainConfig, "")}
"""`scripts/train.py --help <topic>`: the config dataclass of each section and how its keys are spelled."""
EVALUATE_SETTINGS = {"settings": (schema.EvaluateConfig, "")}
"""`scripts/evaluate.py --help settings`."""


def wants_help(argv: Sequence[str]) -> bool:
    return any(arg in ("-h", "--help") for arg in argv)


def help_topic(argv: Sequence[str]) -> str | None:
    """The word after -h/--help (`--help trainer`), if one is there and is not an override."""
    for i, arg in enumerate(argv[:-1]):
        if arg in ("-h", "--help") and "=" not in argv[i + 1] and not argv[i + 1].startswith("-"):
            return argv[i + 1]
    return None


def settings_text(topic: str, topics: Dict[str, Any]) -> str:
    """`--help <topic>`: every setting of the topic's config section, its type, default and what it does
    (the field docstrings of `hacrl_lightning.config`, the one place a setting is declared)."""
    if topic not in topics:
        raise ConfigError([Problem("--help", topic, f"one of {list(topics)}", f"e.g. --help {next(iter(topics))}")])
    cls, prefix = topics[topic]
    title = "settings" if topic == "settings" else f"{topic} settings"
    return "\n".join([f"{title} (set with {prefix}<name>=<value>):", *schema.settings_help(cls, prefix)])


def help_text(doc: str, *, groups: Sequence[str] = (), path_key: str = "run_dir",
              topics: Dict[str, Any] | None = None) -> str:
    """A script's `--help`: its docstring, the presets of each config group in `groups`, where each setting
    is described (`--help <topic>` of `topics`), and the flags."""
    lines = [doc.strip(), ""]
    if groups:
        lines.append("Presets (choose with <group>=<name>, e.g. algorithm=gspo_x2; agents=[a,b] picks several):")
        lines += [f"  {group}: {', '.join(group_options(group))}" for group in groups if (CONFIG_DIR / group).is_dir()]
        lines.append("")
    if topics:
        lines += [f"Each setting, its default and what it does: --help <{'|'.join(topics)}>", ""]
    lines += ["Every key and its value: --cfg job. A value with =, ',', ~ or non-ASCII letters: quote it for Hydra",
              f"and the whole argument for the shell, e.g. \"{path_key}='runs/lr=1e-4,seed=0'\".",
              "Flags: --cfg job (print the composed config and exit), -h/--help. Hydra's -m/--multirun is not",
              "supported: scripts/compare.py runs several methods, seeds or settings."]
    return "\n".join(lines)


def parse_cli(argv: Sequence[str]) -> tuple[list[str], bool]:
    """Split `--cfg job` (print the config and exit) from the Hydra overrides; any other flag stays among
    them for `check_overrides` to refuse with its fix."""
    args = list(argv)
    show = False
    for flag in ("--cfg", "-c"):
        while flag in args:
            i = args.index(flag)
            if i + 1 >= len(args) or args[i + 1] != "job":
                raise ConfigError([Problem(flag, args[i + 1] if i + 1 < len(args) else None, "job",
                                           f"write {flag} job to print the composed config")])
            del args[i : i + 2]
            show = True
    return args, show
