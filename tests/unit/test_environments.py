"""Environments without an engine: tool-call parsing, the safe calculator, the two built-in games' steps and rows,
the catalogue, and the run config's multi-turn rules."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestration.config.errors import ConfigError
from orchestration.config.files import load_config
from tasks.config import DataConfig
from tasks.dataset import DatasetTooSmall, Prompt
from tasks.environments.base import ModelTurn
from tasks.environments.catalog import setup_environment
from tasks.environments.config import EnvironmentConfig
from tasks.environments.guessing import GuessingGame
from tasks.environments.host import HostedEnvironment
from tasks.environments.tool_calls import MAX_CALL_CHARS, MAX_CALLS, Tool, parse, run_calls
from tasks.environments.tool_countdown import CALCULATOR, ToolCountdown, calculate

ROOT = Path(__file__).resolve().parents[2]
TOOL_CONFIG = ROOT / "configs" / "tool_countdown_smollm2_cpu.yaml"
ECHO = Tool("echo", "repeats its text", "text", lambda text: text.upper())


# ---- tool calls --------------------------------------------------------------------------------------------------
def test_hermes_calls_are_read_in_order_with_their_arguments():
    text = ('I will check. <tool_call>{"name": "calculator", "arguments": {"expression": "3 + 4"}}</tool_call> and '
            '<tool_call>[{"name": "echo", "arguments": "{\\"text\\": \\"hi\\"}"}]</tool_call>')
    calls = parse(text, [CALCULATOR, ECHO], "hermes")
    assert [(c.name, c.arguments, c.error) for c in calls] == [
        ("calculator", {"expression": "3 + 4"}, None), ("echo", {"text": "hi"}, None)]


def test_a_call_cut_by_its_stop_string_is_read_to_the_end_of_the_turn():
    # The engine drops the stop string `</tool_call>` from the text: the block has no closing tag.
    calls = parse('<tool_call>{"name": "calculator", "arguments": {"expression": "2*3"}}', [CALCULATOR], "hermes")
    assert calls[0].arguments == {"expression": "2*3"}
    assert parse("<calculator>12 - 5", [CALCULATOR], "tags")[0].arguments == {"expression": "12 - 5"}


@pytest.mark.parametrize(("text", "error"), [
    ("<tool_call>{not json}</tool_call>", "not valid JSON"),
    ('<tool_call>{"arguments": {}}</tool_call>', "needs {\"name\""),
    ('<tool_call>{"name": "calculator", "arguments": [1]}</tool_call>', "must be a JSON object"),
    ("<tool_call>" + "x" * (MAX_CALL_CHARS + 1) + "</tool_call>", "longer than"),
])
def test_malformed_calls_come_back_as_errors_not_silence(text, error):
    [call] = parse(text, [CALCULATOR], "hermes")
    assert call.error is not None and error in call.error
    [message] = run_calls([call], [CALCULATOR])
    assert message["role"] == "tool" and message["content"].startswith("error:")


def test_run_calls_answers_each_call_and_names_the_problems():
    calls = parse("<calculator>6 * 7</calculator><calculator>1 / 0</calculator><calculator>x</calculator>",
                  [CALCULATOR], "tags")
    assert [m["content"] for m in run_calls(calls, [CALCULATOR])] == [
        "42", "error: division by zero", "error: token 'x' is not an integer, + - * / or a parenthesis"]
    unknown = parse('<tool_call>{"name": "shell", "arguments": {"cmd": "ls"}}</tool_call>', [CALCULATOR], "hermes")
    assert "no tool named 'shell'" in run_calls(unknown, [CALCULATOR])[0]["content"]
    many = parse("<calculator>1</calculator>" * (MAX_CALLS + 1), [CALCULATOR], "tags")
    assert run_calls(many, [CALCULATOR])[-1]["content"] == f"error: at most {MAX_CALLS} tool calls per turn"


@pytest.mark.parametrize("hostile", ["9**9**9", "__import__('os').system('true')", "2" * 300,
                                     "(" * 60 + "1" + ")" * 60])
def test_the_calculator_never_runs_model_text(hostile):
    with pytest.raises(ValueError):
        calculate(hostile)


def test_the_calculator_is_exact():
    assert calculate("(1 / 3) * 3") == "1"
    assert calculate(" 7 / 2 ") == "7/2"


# ---- tool countdown ----------------------------------------------------------------------------------------------
ROW = Prompt("countdown-train-000000", "countdown", None, None, {"numbers": [12, 5], "target": 60})


def test_tool_countdown_answers_a_call_then_scores_the_answer():
    episode = ToolCountdown().episode(ROW)
    opening = episode.opening()
    assert [m["role"] for m in opening] == ["system", "user"] and "<calculator>" in opening[0]["content"]
    assert "[12, 5]" in opening[1]["content"] and "60" in opening[1]["content"]
    reply = episode.step(ModelTurn("<calculator>12 * 5", 0))
    assert not reply.done and reply.messages == [{"role": "tool", "name": "calculator", "content": "60"}]
    assert reply.info == {"tool_calls": 1}
    assert episode.step(ModelTurn("12 * 5 = 60", 1)).reward == 1.0
    assert ToolCountdown().episode(ROW).step(ModelTurn("12 + 5", 0)).reward == 0.0


def test_require_tool_call_scores_an_answer_only_after_a_call():
    env = ToolCountdown(require_tool_call=True)
    assert env.episode(ROW).step(ModelTurn("12 * 5", 0)).reward == 0.0
    episode = env.episode(ROW)
    episode.step(ModelTurn("<calculator>12*5</calculator>", 0))
    assert episode.step(ModelTurn("12 * 5", 1)).reward == 1.0


def test_tool_countdown_stops_a_turn_after_a_call():
    assert ToolCountdown(tool_format="tags").stop == ["</calculator>"]
    assert ToolCountdown(tool_format="hermes").stop == ["</tool_call>"]


# ---- guessing game -----------------------------------------------------------------------------------------------
def test_guessing_game_says_higher_lower_and_ends_on_the_secret():
    env = GuessingGame(highs=(16, 16))
    episode = env.episode(Prompt("g", "guess", None, None, {"secret": 11, "high": 16}))
    assert "1 to 16" in episode.opening()[1]["content"]
    assert episode.step(ModelTurn("8", 0)).messages == [{"role": "user", "content": "Higher."}]
    assert episode.step(ModelTurn("My guess is 13.", 1)).messages == [{"role": "user", "content": "Lower."}]
    no_number = episode.step(ModelTurn("hmm", 2))
    assert not no_number.done and no_number.info == {"invalid_guesses": 1}
    found = episode.step(ModelTurn("11", 3))
    assert found.done and found.reward == 1.0


def test_guessing_rows_are_split_by_content_and_seeded():
    env, data = GuessingGame(), DataConfig(train_size=40, eval_size=5, seed=3)
    train, held_out = env.rows(data, "train"), env.rows(data, "eval")
    key = lambda rows: {(r.reference["secret"], r.reference["high"]) for r in rows}  # noqa: E731
    assert len(key(train)) == 40 and len(key(held_out)) == 5 and not key(train) & key(held_out)
    assert [r.reference for r in env.rows(data, "train")] == [r.reference for r in train]
    assert [r.reference for r in env.rows(data.model_copy(update={"seed": 4}), "train")] != [r.reference for r in train]
    with pytest.raises(DatasetTooSmall, match="data.eval_size=500"):
        env.rows(DataConfig(eval_size=500), "eval")


# ---- catalogue and config ----------------------------------------------------------------------------------------
def test_catalogue_builds_built_ins_and_import_paths():
    """Built here too (an import error fails the run in seconds); their episodes run in processes of their own."""
    guessing = setup_environment(EnvironmentConfig(name="guessing", params={"highs": [8, 8]}))
    assert isinstance(guessing, HostedEnvironment) and isinstance(guessing.environment, GuessingGame)
    made = setup_environment(EnvironmentConfig(name="tasks.environments.tool_countdown:ToolCountdown"))
    assert isinstance(made.environment, ToolCountdown) and made.stop == made.environment.stop
    assert made.host.proc is None, "the host process starts with the first episode, not at setup"
    with pytest.raises(ValueError, match="cannot be imported"):
        setup_environment(EnvironmentConfig(name="no_such_module:Env"))
    with pytest.raises(ValueError, match="has no episode"):
        setup_environment(EnvironmentConfig(name="tasks.environments.tool_countdown:calculate",
                                            params={"expression": "1"}))


def test_config_errors_name_the_key():
    with pytest.raises(ConfigError, match="environment.params.tool_format"):
        load_config(TOOL_CONFIG, ["environment.params.tool_format=json"])
    with pytest.raises(ConfigError, match="environment.name 'nope'"):
        load_config(TOOL_CONFIG, ["environment.name=nope"])


@pytest.mark.parametrize("override", ["rollout.sampling.repetition_penalty=1.1", "rollout.sampling.min_tokens=2",
                                      "rollout.sampling.presence_penalty=0.5"])
def test_multi_turn_refuses_history_penalties_in_one_line(override):
    with pytest.raises(ConfigError) as err:
        load_config(TOOL_CONFIG, [override])
    assert "modelled by the learner for one turn only" in str(err.value) and "\n" not in str(err.value)


def test_rewards_may_be_left_out_only_with_an_environment():
    assert load_config(TOOL_CONFIG).rewards is None
    with pytest.raises(ConfigError, match="rewards: missing"):
        load_config(TOOL_CONFIG, ["environment=null"])
    with pytest.raises(ConfigError, match="max_episode_tokens"):
        load_config(TOOL_CONFIG, ["environment.max_episode_tokens=2048"])
