"""The tiny task: generator, tokenizer and verifier
(docs/method.md#the-embedded-default-a-tiny-verifiable-task)."""
import collections
import dataclasses

import numpy as np
import pytest

from orl_jax.data import tiny_task
from orl_jax.data.tiny_task import TinyTaskConfig, tiny_tokenizer, tokenizer_for
from orl_jax.data.tokenizer import SPECIAL_TOKENS, WordTokenizer
from orl_jax.problem import Problem, Verifier
from orl_jax.verify.tiny import TinyVerifier, extract_answer

CFG = TinyTaskConfig()
N_CHECKED = 5000
N_OVERLAP_TRAIN = 20_000


@pytest.fixture(scope="module")
def train_problems():
  return [tiny_task.train_problem(i, CFG) for i in range(N_OVERLAP_TRAIN)]


@pytest.fixture(scope="module")
def eval_set():
  return tiny_task.eval_problems(CFG)


def test_same_index_gives_same_problem():
  for index in (0, 1, 17, 123_456):
    assert tiny_task.train_problem(index, CFG) == tiny_task.train_problem(index, CFG)
    assert (tiny_task.generate_problem(index, "eval", CFG)
            == tiny_task.generate_problem(index, "eval", CFG))
  assert tiny_task.eval_problems(CFG) == tiny_task.eval_problems(CFG)


def test_problem_fields(eval_set):
  assert len(eval_set) == CFG.n_eval
  assert eval_set[5].problem_id == "tiny-eval-5"
  assert tiny_task.train_problem(123, CFG).problem_id == "tiny-train-123"
  for problem in eval_set:
    assert problem.target.endswith(f"#### {int(problem.answer):02d}")
    assert problem.answer.isdigit()


def test_different_indices_and_seeds_differ(train_problems):
  prompts = [p.prompt for p in train_problems[:1000]]
  assert len(set(prompts)) > 990
  other_seed = dataclasses.replace(CFG, train_seed=7)
  changed = sum(tiny_task.train_problem(i, other_seed).prompt != prompts[i] for i in range(200))
  assert changed > 195


def test_token_limits_respected(train_problems):
  for problem in train_problems[:N_CHECKED]:
    assert tiny_task.count_tokens(problem.prompt) <= CFG.max_prompt_tokens, problem
    assert tiny_task.count_tokens(problem.target) <= CFG.max_response_tokens, problem
    # The response plus its EOS is one 32-token block.
    assert len(tiny_tokenizer().encode(problem.target, add_eos=True)) <= 32


def test_tighter_limits_are_respected_and_impossible_ones_fail_loudly():
  tight = dataclasses.replace(CFG, max_prompt_tokens=24, max_response_tokens=21)
  for i in range(300):
    problem = tiny_task.train_problem(i, tight)
    assert tiny_task.count_tokens(problem.prompt) <= 24
    assert tiny_task.count_tokens(problem.target) <= 21
  with pytest.raises(ValueError, match="max_response_tokens"):
    tiny_task.train_problem(0, dataclasses.replace(CFG, max_response_tokens=5))


def test_chain_of_thought_arithmetic_is_correct(train_problems):
  n_ops = collections.Counter()
  for problem in train_problems[:N_CHECKED]:
    steps = tiny_task.parse_steps(problem.target)
    assert CFG.min_ops <= len(steps) <= CFG.max_ops
    n_ops[len(steps)] += 1
    prompt_numbers = [int(w) for w in problem.prompt.split() if w.isdigit()]
    # The first step starts from the prompt's starting count; each later one from the last result.
    assert steps[0][0] == prompt_numbers[0]
    for (left, op, right, result), previous in zip(steps, [None] + steps[:-1]):
      if previous is not None:
        assert left == previous[3]
      assert result == {"+": left + right, "-": left - right, "*": left * right}[op]
      assert result >= 1
      if op == "*":
        assert 2 <= right <= CFG.max_product_operand
      else:
        assert 1 <= right <= CFG.max_operand
    assert problem.answer == str(steps[-1][3])
    # The answer has to be computed: it is none of the prompt's numbers.
    assert int(problem.answer) not in prompt_numbers


def test_distribution_is_sane(train_problems):
  problems = train_problems[:N_CHECKED]
  steps = [tiny_task.parse_steps(p.target) for p in problems]
  n_ops = collections.Counter(len(s) for s in steps)
  ops = collections.Counter(step[1] for s in steps for step in s)
  # Long problems are re-drawn more often, so 3 ops is a bit rarer than 2 (measured ~45%).
  assert 0.35 < n_ops[3] / len(problems) < 0.6
  for op in ("+", "-", "*"):
    assert ops[op] / sum(ops.values()) > 0.2, ops
  answers = collections.Counter(p.answer for p in problems)
  assert len(answers) > 0.9 * CFG.max_value  # nearly every value in 1..max_value occurs
  assert answers.most_common(1)[0][1] / len(problems) < 0.05
  names = collections.Counter(p.prompt.split()[0] for p in problems)
  assert len(names) == 20
  # Word multipliers ("doubles", "triple") show up, as do numeric ones.
  prompt_words = collections.Counter(w for p in problems for w in p.prompt.split())
  assert prompt_words["doubles"] + prompt_words["double"] > 50
  assert prompt_words["by"] > 50


def test_op_knobs():
  only_add = dataclasses.replace(CFG, ops=("+",), min_ops=4, max_ops=4, max_operand=5,
                                 fixed_width=False)
  for i in range(50):
    steps = tiny_task.parse_steps(tiny_task.train_problem(i, only_add).target)
    assert len(steps) == 4 and {s[1] for s in steps} == {"+"}
    assert all(s[2] <= 5 for s in steps)


@pytest.mark.parametrize("bad", [dict(min_ops=3, max_ops=2), dict(ops=("/",)), dict(ops=()),
                                 dict(ops=("-",)), dict(eval_seed=0), dict(max_operand=1)])
def test_bad_config_is_rejected(bad):
  with pytest.raises(ValueError, match="TinyTaskConfig"):
    dataclasses.replace(CFG, **bad)


def test_unknown_split_is_rejected():
  with pytest.raises(ValueError, match="split"):
    tiny_task.generate_problem(0, "test", CFG)


def test_eval_and_train_streams_are_disjoint(train_problems, eval_set):
  assert CFG.train_seed != CFG.eval_seed
  # Eval index i is not train index i (independent streams, not a shifted copy).
  assert sum(e.prompt == t.prompt for e, t in zip(eval_set, train_problems)) == 0
  # Small numbers make an exact prompt collision possible; it is rare (measured 0 of 512 against
  # the first 20k training prompts). The bound keeps the test meaningful if the grammar shrinks.
  train_prompts = {p.prompt for p in train_problems}
  overlap = sum(p.prompt in train_prompts for p in eval_set) / len(eval_set)
  assert overlap < 0.02, f"eval/train prompt overlap {overlap:.2%}"


def test_tokenizer_special_ids_and_vocab_is_fixed():
  tok = tiny_tokenizer()
  assert tok.vocab[:len(SPECIAL_TOKENS)] == SPECIAL_TOKENS
  assert (tok.pad_id, tok.mask_id, tok.eos_id, tok.bos_id) == (0, 1, 2, 3)
  assert tok.vocab[len(SPECIAL_TOKENS):] == tuple(sorted(tok.vocab[len(SPECIAL_TOKENS):]))
  assert tok.vocab_size == len(tok.vocab) == len(set(tok.vocab))
  assert tokenizer_for(CFG) is tok
  # Rebuilding from the same lexicon in another order gives the same vocabulary and hash.
  rebuilt = WordTokenizer(sorted(tiny_task.lexicon(), reverse=True))
  assert rebuilt.vocab == tok.vocab and rebuilt.vocab_hash() == tok.vocab_hash()
  assert WordTokenizer(tiny_task.lexicon() | {"pears"}).vocab_hash() != tok.vocab_hash()
  for digit in "0123456789":
    assert digit in tok.vocab


def test_every_generated_text_encodes_and_round_trips(train_problems, eval_set):
  tok = tiny_tokenizer()
  for problem in train_problems[:N_CHECKED] + eval_set:
    for text in (problem.prompt, problem.target):
      ids = tok.encode(text)  # raises on a word outside the lexicon
      assert tok.unk_id not in ids
      assert len(ids) == tiny_task.count_tokens(text)
      assert tok.decode(ids) == text


def test_digits_are_single_tokens_and_decode_rejoins_them():
  tok = tiny_tokenizer()
  ids = tok.encode("12 * 3 = 36 . #### 36", add_bos=True, add_eos=True)
  words = [tok.vocab[i] for i in ids]
  assert words == ["<bos>", "1", "2", "*", "3", "=", "3", "6", ".", "####", "3", "6", "<eos>"]
  assert tok.decode(ids) == "12 * 3 = 36 . #### 36"
  assert tok.decode(ids, skip_special=False) == "<bos> 12 * 3 = 36 . #### 36 <eos>"
  # A special token between digits ends the number.
  two, seven = tok.encode("2 7")
  assert tok.decode([two, tok.mask_id, seven]) == "2 7"
  assert tok.decode([two, seven, tok.eos_id, seven], stop_at_eos=True) == "27"
  assert tok.decode(np.array([two, seven, tok.pad_id, tok.pad_id])) == "27"


def test_unknown_words_raise_or_map_to_unk():
  tok = tiny_tokenizer()
  with pytest.raises(ValueError, match="pears"):
    tok.encode("ann has 3 pears .")
  ids = tok.encode("ann has 3 pears .", allow_unknown=True)
  assert ids[3] == tok.unk_id
  with pytest.raises(ValueError, match="outside the vocabulary"):
    tok.decode([tok.vocab_size])


def test_verifier_scores_target_one_and_corrupted_answer_zero(eval_set):
  verifier: Verifier = TinyVerifier()
  tok = tiny_tokenizer()
  problems = eval_set[:100]
  # Through the tokenizer, as a rollout would produce it: response, EOS, padding.
  decoded = [tok.decode(tok.encode(p.target, add_eos=True) + [tok.pad_id] * 3, stop_at_eos=True)
             for p in problems]
  assert verifier.score_batch(problems, decoded) == [1.0] * len(problems)
  corrupted = [p.target.rsplit("####", 1)[0] + f"#### {int(p.answer) + 1}" for p in problems]
  assert verifier.score_batch(problems, corrupted) == [0.0] * len(problems)


def test_verifier_reads_one_answer_mark():
  verifier = TinyVerifier()
  problem = Problem("p", "q", answer="27")
  assert verifier.score(problem, "9 * 3 = 27 . #### 27") == 1.0
  assert verifier.score(problem, "#### 3 . 9 * 3 = 27 . #### 27") == 0.0   # a second candidate
  assert verifier.score(problem, "#### 27 . #### 3") == 0.0
  assert verifier.score(problem, "9 * 3 = 27 .") == 0.0          # no mark
  assert verifier.score(problem, "#### .") == 0.0                # mark without a number
  assert verifier.score(problem, "#### 270") == 0.0
  assert verifier.score(problem, "#### 2 7") == 0.0              # two numbers in decoded text
  assert extract_answer("x . #### 027 .") == "27"
  assert extract_answer("x #### 27") is None                    # a mark after a word
  with pytest.raises(ValueError, match="responses"):
    verifier.score_batch([problem], [])


def test_fixed_width_layout_depends_only_on_the_number_of_operations(train_problems):
  for problem in train_problems[:2000]:
    steps = tiny_task.parse_steps(problem.target)
    numbers = [w for w in problem.target.split() if w.isdigit()]
    assert all(len(w) == 2 for w in numbers)                    # every number two digits
    assert tiny_task.count_tokens(problem.target) == 9 * len(steps) + 3
  plain = dataclasses.replace(CFG, fixed_width=False)
  assert "07 - 04" not in tiny_task.generate_problem(1, "eval", plain).target


def test_commuted_operands_keep_the_arithmetic_and_the_layout():
  commuting = dataclasses.replace(CFG, commute_probability=0.3)
  n_steps = n_swapped = 0
  for i in range(2000):
    problem = tiny_task.train_problem(i, commuting)
    steps = tiny_task.parse_steps(problem.target)
    assert tiny_task.count_tokens(problem.target) == 9 * len(steps) + 3
    count = int([w for w in problem.prompt.split() if w.isdigit()][0])
    for left, op, right, result in steps:
      assert result == {"+": left + right, "-": left - right, "*": left * right}[op]
      swapped = left != count
      if swapped:                                   # the running count is written second
        assert op in "+*" and right == count
      n_steps += op in "+*"
      n_swapped += swapped
      count = result
    assert problem.answer == str(count)
  assert 0.25 < n_swapped / n_steps < 0.35          # left == right steps never count as swapped
  # Off by default, and then the stream is exactly the one without the knob.
  assert TinyTaskConfig().commute_probability == 0.0
  with pytest.raises(ValueError, match="commute_probability"):
    dataclasses.replace(CFG, commute_probability=1.5)
