"""The built-in components — samplers, schedulers, tool parsers, losses, advantage estimators —
registered through the same hooks as any third-party plugin's (rewards and the built-in task
register from :mod:`rlcore.rewards` and :mod:`rlcore.data.tasks`, next to their code).

Factories are ``"module:attr"`` strings, so loading plugins imports neither torch nor vLLM: listing
samplers works where vLLM is not installed, and the ``vllm`` backend says how to install it when used.
"""

from __future__ import annotations

from typing import Callable

from .hookspecs import hookimpl

@hookimpl
def register_samplers(register: Callable[..., None]) -> None:
    register("hf", "rlcore.sampling.hf.sampler:HFSampler", aliases=("transformers",),
             description="transformers model in-process, micro-batched; CPU or GPU")
    register("vllm", "rlcore.sampling.vllm.engine:VLLMSampler",
             description="in-process vLLM engine (GPU); pip install 'rlcore[vllm]'")
    register("openai", "rlcore.sampling.openai:OpenAISampler", aliases=("vllm_server",),
             description="a vLLM / OpenAI-compatible server over HTTP (/v1/completions, token ids)")


@hookimpl
def register_schedulers(register: Callable[..., None]) -> None:
    register("default", "rlcore.rollout.scheduler:RolloutScheduler", aliases=("single_turn",),
             description="one completion per prompt")
    register("multi_turn", "rlcore.rollout.scheduler:MultiTurnScheduler",
             description="many turns; subclass and override step/check_finished (ms-swift style)")
    register("tool_scheduler", "rlcore.rollout.tools:ToolScheduler", aliases=("tool_call_scheduler",),
             description="runs the model's tool calls (its family's format: tool_parser) with registered tools until none remain or max_turns")
    register("env_scheduler", "rlcore.rollout.env_scheduler:EnvScheduler",
             description="one registered env per trajectory (--env NAME or env_config.name), multi-turn")
    # TRL's agent arguments of GRPOTrainer (tools=, environment_factory=, rollout_func=) choose these
    register("trl_tools", "rlcore.compat.trl.agents:TRLToolScheduler",
             description="TRL's tools=: the tool loop with TRL's tools/* counters from zero")
    register("trl_environment", "rlcore.compat.trl.agents:EnvironmentToolScheduler",
             description="TRL's environment_factory=: one environment per trajectory, its methods the tools")
    register("trl_rollout_func", "rlcore.compat.trl.agents:RolloutFuncScheduler",
             description="TRL's rollout_func=: a function produces each batch's token ids and logprobs")


@hookimpl
def register_tool_parsers(register: Callable[..., None]) -> None:
    register("hermes", "rlcore.rollout.tool_parsers:HermesToolParser",
             description='<tool_call>{"name": …, "arguments": {…}}</tool_call> (Qwen2.5, Qwen3, Hermes)')
    register("qwen3_xml", "rlcore.rollout.tool_parsers:Qwen3XMLToolParser", aliases=("qwen3_coder",),
             description="<tool_call><function=NAME><parameter=ARG>…</parameter></function></tool_call> (Qwen3.5, qwen3-coder, Nemotron 3)")
    register("llama3_json", "rlcore.rollout.tool_parsers:Llama3JSONToolParser", aliases=("llama3",),
             description='the reply is {"name": …, "parameters": {…}} (Llama 3.1, 3.2)')
    register("gptoss", "rlcore.rollout.tool_parsers:GptOssToolParser", aliases=("harmony",),
             description="harmony: <|channel|>commentary to=functions.NAME <|constrain|>json<|message|>{…}<|call|> (gpt-oss)")
    register("deepseek_v3", "rlcore.rollout.tool_parsers:DeepSeekV3ToolParser", aliases=("deepseekv3",),
             description="<｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME + fenced JSON <｜tool▁call▁end｜> (DeepSeek-V3, R1; V3.1's NAME<｜tool▁sep｜>{…})")
    register("gemma4", "rlcore.rollout.tool_parsers:Gemma4ToolParser",
             description='<|tool_call>call:NAME{key:<|"|>text<|"|>,n:1}<tool_call|> (Gemma 4, DiffusionGemma)')
    register("muse_atem", "rlcore.rollout.tool_parsers:MuseAtemToolParser", aliases=("atem",),
             description='<atem:function_calls><atem:invoke name="NAME"><atem:parameter name="ARG">…</atem:parameter>… (Muse Glimmer)')
    register("response_schema", "rlcore.rollout.tool_parsers:ResponseSchemaToolParser",
             description="transformers' tokenizer.parse_response with the tokenizer's response template (or TRL's for its template)")


_LOSSES = ("grpo", "bnpo", "dr_grpo", "dapo", "gspo", "cispo", "sapo", "luspo", "vespo", "opd")


@hookimpl
def register_losses(register: Callable[..., None]) -> None:
    for name in _LOSSES:
        register(name, f"rlcore.algorithms.losses:{name}_loss")


@hookimpl
def register_advantages(register: Callable[..., None]) -> None:
    register("grpo", "rlcore.algorithms.advantages:GRPOAdvantage")
    register("rloo", "rlcore.algorithms.advantages:RLOOAdvantage")
    register("reinforce_plus_plus", "rlcore.algorithms.advantages:ReinforcePPAdvantage", aliases=("reinforce++",))
    register("gigpo", "rlcore.algorithms.advantages:GiGPOAdvantage")
