"""The test server's ``/v1/chat/completions``: a real HTTP chat endpoint on 127.0.0.1, generating with
a real tiny model or answering scripted text (what rl-plugin-judge's tests talk to)."""

from __future__ import annotations

import asyncio

import httpx

from rlcore import SamplingParams
from rlcore.sampling.hf.sampler import HFSampler
from rlcore.testing.openai_server import OpenAICompatServer


def test_chat_completion_generates_from_the_rendered_messages(tiny_model_dir: str) -> None:
    sampler = HFSampler(tiny_model_dir, batch_window_ms=5, seed=0)
    messages = [{"role": "user", "content": "how many apples"}]
    with OpenAICompatServer(sampler) as server:
        r = httpx.post(server.url + "/v1/chat/completions",
                       json={"model": "rlcore-tiny", "messages": messages, "max_tokens": 6, "temperature": 0.7, "seed": 3},
                       timeout=30)
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["object"] == "chat.completion"
        (choice,) = body["choices"]
        assert choice["message"]["role"] == "assistant" and choice["finish_reason"] in ("stop", "length")
        tok = sampler.tokenizer
        prompt = tok.encode(tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True),
                            add_special_tokens=False)
        direct = asyncio.run(sampler.generate(prompt, SamplingParams(max_tokens=6, temperature=0.7, seed=3)))
        assert choice["message"]["content"] == direct.text  # the chat template rendered, then the model sampled
        assert body["usage"]["prompt_tokens"] == len(prompt)
        assert body["usage"]["completion_tokens"] == len(direct.token_ids)
        assert server.requests[-1]["messages"] == messages and server.peak_running == 1
        bad = httpx.post(server.url + "/v1/chat/completions", json={"messages": "hi"}, timeout=30)
        assert bad.status_code == 400 and "messages" in bad.json()["message"]


def test_chat_completion_scripted_replies_faults_and_peak_concurrency(scripted_sampler) -> None:
    sampler = scripted_sampler(["Score: 7"], delay=0.2)
    with OpenAICompatServer(sampler) as server:
        server.faults.append(503)
        url = server.url + "/v1/chat/completions"
        payload = {"messages": [{"role": "user", "content": "judge this"}], "max_tokens": 16}
        assert httpx.post(url, json=payload, headers={"Authorization": "Bearer k"}, timeout=30).status_code == 503
        assert server.request_headers[-1]["authorization"] == "Bearer k"  # injected fault, then normal service

        async def many() -> list[httpx.Response]:
            async with httpx.AsyncClient(timeout=30) as client:
                return await asyncio.gather(*(client.post(url, json=payload) for _ in range(3)))

        replies = asyncio.run(many())
        assert [r.json()["choices"][0]["message"]["content"] for r in replies] == ["Score: 7"] * 3
        assert server.peak_running == 3  # the three overlapped at the server
