"""Prompt builders for GSM8K and HumanEval, and the chat templates of the supported models.

The GSM8K few-shot examples are written here (our own problems, none from GSM8K), in the GSM8K
solution format that the verifier reads: reasoning lines, then `#### <number>`.

Chat templates (checked against the models' published `chat_template`s):
* LLaDA-8B-Instruct uses the Llama-3 layout with `<|startoftext|>` as BOS; its Jinja template
  trims each message (`message['content'] | trim`), so `llada_chat` strips the message too.
* Qwen3 uses ChatML. With `enable_thinking=False` Qwen3's own template also appends an empty
  `<think>\\n\\n</think>\\n\\n` to the assistant turn: pass `empty_think=True` for that.
"""
from __future__ import annotations

import dataclasses
from typing import Callable, Sequence

from orl_jax.problem import Problem

LLADA_BOS = "<|startoftext|>"
CHAT_TEMPLATES = ("none", "llada", "qwen3")

# (question, solution ending in `#### <answer>`): written for this file, not taken from GSM8K.
GSM8K_EXAMPLES: tuple[tuple[str, str], ...] = (
    ("A baker makes 24 muffins in the morning and 18 muffins in the afternoon. She sells 35 of "
     "them. How many muffins does she have left?",
     "The baker makes 24 + 18 = 42 muffins.\nAfter selling 35, she has 42 - 35 = 7 muffins "
     "left.\n#### 7"),
    ("Tom buys 3 notebooks for $4 each and a pen for $2. He pays with a $20 bill. How much "
     "change does he get?",
     "The notebooks cost 3 * 4 = $12.\nWith the pen, Tom spends 12 + 2 = $14.\nHis change is "
     "20 - 14 = $6.\n#### 6"),
    ("A garden has 5 rows of tomato plants with 8 plants in each row. Each plant grows 6 "
     "tomatoes. How many tomatoes grow in the garden?",
     "There are 5 * 8 = 40 plants.\nThey grow 40 * 6 = 240 tomatoes.\n#### 240"),
    ("Maria reads 15 pages of a book every day. The book has 180 pages and she has already "
     "read for 4 days. How many more days does she need to finish the book?",
     "Maria has read 15 * 4 = 60 pages.\nShe has 180 - 60 = 120 pages left.\nShe needs "
     "120 / 15 = 8 more days.\n#### 8"),
    ("A school trip needs buses for 130 students and 10 teachers. Each bus holds 40 people. "
     "How many buses are needed?",
     "There are 130 + 10 = 140 people.\n140 / 40 = 3.5, so 3 buses are not enough and they "
     "need 4 buses.\n#### 4"),
    ("Ken earns $12 per hour. He works 6 hours on Saturday and half as many hours on Sunday. "
     "How much does he earn over the weekend?",
     "On Sunday Ken works 6 / 2 = 3 hours.\nHe works 6 + 3 = 9 hours in total.\nHe earns "
     "9 * 12 = $108.\n#### 108"),
    ("A store had 250 shirts. It sold 40% of them on Monday. How many shirts are left?",
     "The store sold 250 * 40 / 100 = 100 shirts.\nIt has 250 - 100 = 150 shirts left.\n"
     "#### 150"),
    ("The temperature was 4 degrees in the morning. By midnight it had dropped by 9 degrees. "
     "What was the temperature at midnight?",
     "The temperature at midnight was 4 - 9 = -5 degrees.\n#### -5"),
)

GSM8K_INSTRUCTION = ("Solve the math problem step by step. End your answer with a line "
                     "'#### <number>'.")
HUMANEVAL_INSTRUCTION = "Complete the following Python function."


def llada_chat(message: str, bos: bool = True) -> str:
  """One user turn and the opening of the assistant turn in LLaDA-8B-Instruct's template."""
  return ((LLADA_BOS if bos else "") + "<|start_header_id|>user<|end_header_id|>\n\n"
          + message.strip() + "<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n")


def qwen3_chat(message: str, empty_think: bool = False) -> str:
  """One user turn and the opening of the assistant turn in Qwen3's ChatML template."""
  prompt = f"<|im_start|>user\n{message}<|im_end|>\n<|im_start|>assistant\n"
  return prompt + ("<think>\n\n</think>\n\n" if empty_think else "")


def apply_chat(message: str, template: str) -> str:
  """Wraps `message` in the named template ('none' returns it unchanged)."""
  if template == "none":
    return message
  if template == "llada":
    return llada_chat(message)
  if template == "qwen3":
    return qwen3_chat(message)
  raise ValueError(f"Unknown chat template {template!r}; expected one of {CHAT_TEMPLATES}.")


def render_chat(messages: Sequence[tuple[str, str]], template: str) -> str:
  """A conversation of (role, content) turns (system, user, assistant), then the opening of
  the assistant's turn, in the named template (the one-turn case is `apply_chat`'s text).
  'none' takes one user turn and returns its text: the model has no chat layout."""
  if template == "none":
    if len(messages) != 1 or messages[0][0] != "user":
      raise ValueError("this model has no chat template (task.chat='none'): send one user "
                       "message, or use /v1/completions with the text the model reads")
    return messages[0][1]
  if template == "llada":   # Llama-3 layout; each message trimmed, BOS before the first
    turns = "".join(f"<|start_header_id|>{role}<|end_header_id|>\n\n{content.strip()}<|eot_id|>"
                    for role, content in messages)
    return LLADA_BOS + turns + "<|start_header_id|>assistant<|end_header_id|>\n\n"
  if template == "qwen3":
    turns = "".join(f"<|im_start|>{role}\n{content}<|im_end|>\n" for role, content in messages)
    return turns + "<|im_start|>assistant\n"
  raise ValueError(f"Unknown chat template {template!r}; expected one of {CHAT_TEMPLATES}.")


def gsm8k_prompt(question: str, k_shot: int = 8, chat: str = "none") -> str:
  """A GSM8K prompt with the first `k_shot` examples above.

  Without a chat template it is plain completion text ending in 'Answer:' (base models). With
  one, the examples and the question form the user message, led by `GSM8K_INSTRUCTION`.
  """
  if not 0 <= k_shot <= len(GSM8K_EXAMPLES):
    raise ValueError(f"k_shot={k_shot} must be in [0, {len(GSM8K_EXAMPLES)}] (the number of "
                     "written GSM8K examples).")
  shots = "".join(f"Question: {q}\nAnswer: {a}\n\n" for q, a in GSM8K_EXAMPLES[:k_shot])
  if chat == "none":
    return f"{shots}Question: {question}\nAnswer:"
  return apply_chat(f"{GSM8K_INSTRUCTION}\n\n{shots}Question: {question}", chat)


def humaneval_prompt(code: str, chat: str = "none") -> str:
  """The model input for a HumanEval code prompt; the response continues the function.

  Base models get the code itself. Chat models get the instruction and the code as the user
  message, and an assistant turn that opens a code block and repeats the code, so the response
  still continues the function body (the verifier cuts it at the closing fence).
  """
  if chat == "none":
    return code
  message = f"{HUMANEVAL_INSTRUCTION}\n```python\n{code}```"
  return apply_chat(message, chat) + f"```python\n{code}"


def with_prompts(problems: Sequence[Problem], prompt_fn: Callable[[str], str]) -> list[Problem]:
  """Copies of `problems` whose prompt is `prompt_fn(prompt)` (for answer-matched tasks only:
  code tasks must keep the bare code prompt that the verifier runs)."""
  out = []
  for problem in problems:
    if problem.tests is not None:
      raise ValueError(f"Problem {problem.problem_id!r} is a code task: its prompt is part of "
                       "the program the verifier runs; use humaneval_prompt when tokenizing.")
    out.append(dataclasses.replace(problem, prompt=prompt_fn(problem.prompt)))
  return out
