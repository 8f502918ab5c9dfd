"""The Llama 3.1 and Qwen2.5 chat templates, their ``{% generation %}`` variants, and tiny byte-level
tokenizers for them: the oracle for the SFT data step's ids and masks.

The templates are those of the public Instruct checkpoints' ``tokenizer_config.json``
(huggingface.co/meta-llama/Llama-3.1-8B-Instruct, huggingface.co/Qwen/Qwen2.5-7B-Instruct). Each
marked variant renders the same text, with the assistant's text and its end-of-turn (Qwen2.5: the
``<|im_end|>`` and the newline after it) inside ``{% generation %}``; the role header and the newline
after it stay outside.
"""

from __future__ import annotations

import json
from pathlib import Path

LLAMA31 = """{{- bos_token }}
{%- if custom_tools is defined %}
    {%- set tools = custom_tools %}
{%- endif %}
{%- if not tools_in_user_message is defined %}
    {%- set tools_in_user_message = true %}
{%- endif %}
{%- if not date_string is defined %}
    {%- set date_string = "26 Jul 2024" %}
{%- endif %}
{%- if not tools is defined %}
    {%- set tools = none %}
{%- endif %}

{#- This block extracts the system message, so we can slot it into the right place. #}
{%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content']|trim %}
    {%- set messages = messages[1:] %}
{%- else %}
    {%- set system_message = "" %}
{%- endif %}

{#- System message + builtin tools #}
{{- "<|start_header_id|>system<|end_header_id|>\\n\\n" }}
{%- if builtin_tools is defined or tools is not none %}
    {{- "Environment: ipython\\n" }}
{%- endif %}
{%- if builtin_tools is defined %}
    {{- "Tools: " + builtin_tools | reject('equalto', 'code_interpreter') | join(", ") + "\\n\\n"}}
{%- endif %}
{{- "Cutting Knowledge Date: December 2023\\n" }}
{{- "Today Date: " + date_string + "\\n\\n" }}
{%- if tools is not none and not tools_in_user_message %}
    {{- "You have access to the following functions. To call a function, please respond with JSON for a function call." }}
    {{- 'Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.' }}
    {{- "Do not use variables.\\n\\n" }}
    {%- for t in tools %}
        {{- t | tojson(indent=4) }}
        {{- "\\n\\n" }}
    {%- endfor %}
{%- endif %}
{{- system_message }}
{{- "<|eot_id|>" }}

{#- Custom tools are passed in a user message with some extra guidance #}
{%- if tools_in_user_message and not tools is none %}
    {#- Extract the first user message so we can plug it in here #}
    {%- if messages | length != 0 %}
        {%- set first_user_message = messages[0]['content']|trim %}
        {%- set messages = messages[1:] %}
    {%- else %}
        {{- raise_exception("Cannot put tools in the first user message when there's no first user message!") }}
{%- endif %}
    {{- '<|start_header_id|>user<|end_header_id|>\\n\\n' -}}
    {{- "Given the following functions, please respond with a JSON for a function call " }}
    {{- "with its proper arguments that best answers the given prompt.\\n\\n" }}
    {{- 'Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.' }}
    {{- "Do not use variables.\\n\\n" }}
    {%- for t in tools %}
        {{- t | tojson(indent=4) }}
        {{- "\\n\\n" }}
    {%- endfor %}
    {{- first_user_message + "<|eot_id|>"}}
{%- endif %}

{%- for message in messages %}
    {%- if not (message.role == 'ipython' or message.role == 'tool' or 'tool_calls' in message) %}
        {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'+ message['content'] | trim + '<|eot_id|>' }}
    {%- elif 'tool_calls' in message %}
        {%- if not message.tool_calls|length == 1 %}
            {{- raise_exception("This model only supports single tool-calls at once!") }}
        {%- endif %}
        {%- set tool_call = message.tool_calls[0].function %}
        {%- if builtin_tools is defined and tool_call.name in builtin_tools %}
            {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' -}}
            {{- "<|python_tag|>" + tool_call.name + ".call(" }}
            {%- for arg_name, arg_val in tool_call.arguments | items %}
                {{- arg_name + '="' + arg_val + '"' }}
                {%- if not loop.last %}
                    {{- ", " }}
                {%- endif %}
                {%- endfor %}
            {{- ")" }}
        {%- else  %}
            {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' -}}
            {{- '{"name": "' + tool_call.name + '", ' }}
            {{- '"parameters": ' }}
            {{- tool_call.arguments | tojson }}
            {{- "}" }}
        {%- endif %}
        {%- if builtin_tools is defined %}
            {#- This means we're in ipython mode #}
            {{- "<|eom_id|>" }}
        {%- else %}
            {{- "<|eot_id|>" }}
        {%- endif %}
    {%- elif message.role == "tool" or message.role == "ipython" %}
        {{- "<|start_header_id|>ipython<|end_header_id|>\\n\\n" }}
        {%- if message.content is mapping or message.content is iterable %}
            {{- message.content | tojson }}
        {%- else %}
            {{- message.content }}
        {%- endif %}
        {{- "<|eot_id|>" }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}
{%- endif %}
"""

QWEN25 = """{%- if tools %}
    {{- '<|im_start|>system\\n' }}
    {%- if messages[0]['role'] == 'system' %}
        {{- messages[0]['content'] }}
    {%- else %}
        {{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}
    {%- endif %}
    {{- "\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\nYou are provided with function signatures within <tools></tools> XML tags:\\n<tools>" }}
    {%- for tool in tools %}
        {{- "\\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\"name\\": <function-name>, \\"arguments\\": <args-json-object>}\\n</tool_call><|im_end|>\\n" }}
{%- else %}
    {%- if messages[0]['role'] == 'system' %}
        {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}
    {%- else %}
        {{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\\n' }}
    {%- endif %}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or (message.role == "assistant" and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role }}
        {%- if message.content %}
            {{- '\\n' + message.content }}
        {%- endif %}
        {%- for tool_call in message.tool_calls %}
            {%- if tool_call.function is defined %}
                {%- set tool_call = tool_call.function %}
            {%- endif %}
            {{- '\\n<tool_call>\\n{"name": "' }}
            {{- tool_call.name }}
            {{- '", "arguments": ' }}
            {{- tool_call.arguments | tojson }}
            {{- '}\\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\\n' }}
    {%- elif message.role == "tool" %}
        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\\n<tool_response>\\n' }}
        {{- message.content }}
        {{- '\\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
{%- endif %}
"""


def _replace(template: str, old: str, new: str) -> str:
    assert template.count(old) == 1, old
    return template.replace(old, new)


# Llama 3.1: the assistant's text (or tool call) and its <|eot_id|> / <|eom_id|>.
LLAMA31_MARKED = _replace(
    _replace(
        _replace(
            LLAMA31,
            """        {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'+ message['content'] | trim + '<|eot_id|>' }}""",
            """        {%- if message.role == 'assistant' %}
            {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}
            {%- generation %}{{- message['content'] | trim + '<|eot_id|>' }}{%- endgeneration %}
        {%- else %}
        {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'+ message['content'] | trim + '<|eot_id|>' }}
        {%- endif %}""",
        ),
        """        {%- set tool_call = message.tool_calls[0].function %}
""",
        """        {%- set tool_call = message.tool_calls[0].function %}
        {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' -}}
        {%- generation %}
""",
    ),
    """        {%- if builtin_tools is defined %}
            {#- This means we're in ipython mode #}
            {{- "<|eom_id|>" }}
        {%- else %}
            {{- "<|eot_id|>" }}
        {%- endif %}""",
    """        {%- if builtin_tools is defined %}
            {#- This means we're in ipython mode #}
            {{- "<|eom_id|>" }}
        {%- else %}
            {{- "<|eot_id|>" }}
        {%- endif %}
        {%- endgeneration %}""",
)
LLAMA31_MARKED = LLAMA31_MARKED.replace(
    """            {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' -}}
            {{- "<|python_tag|>\"""",
    """            {{- "<|python_tag|>\"""",
).replace(
    """            {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' -}}
            {{- '{"name": "'""",
    """            {{- '{"name": "'""",
)

# Qwen2.5: the assistant's text, its tool calls, <|im_end|> and the newline after it.
QWEN25_MARKED = _replace(
    _replace(
        QWEN25,
        """    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or (message.role == "assistant" and not message.tool_calls) %}""",
        """    {%- if message.role == "assistant" and not message.tool_calls %}
        {{- '<|im_start|>assistant\\n' }}
        {%- generation %}{{- message.content + '<|im_end|>' + '\\n' }}{%- endgeneration %}
    {%- elif (message.role == "user") or (message.role == "system" and not loop.first) %}""",
    ),
    """        {{- '<|im_start|>' + message.role }}
        {%- if message.content %}
            {{- '\\n' + message.content }}
        {%- endif %}
        {%- for tool_call in message.tool_calls %}
            {%- if tool_call.function is defined %}
                {%- set tool_call = tool_call.function %}
            {%- endif %}
            {{- '\\n<tool_call>\\n{"name": "' }}""",
    """        {{- '<|im_start|>' + message.role + '\\n' }}
        {%- generation %}
        {%- if message.content %}
            {{- message.content }}
        {%- endif %}
        {%- for tool_call in message.tool_calls %}
            {%- if tool_call.function is defined %}
                {%- set tool_call = tool_call.function %}
            {%- endif %}
            {%- if message.content or not loop.first %}
                {{- '\\n' }}
            {%- endif %}
            {{- '<tool_call>\\n{"name": "' }}""",
)
QWEN25_MARKED = _replace(
    QWEN25_MARKED,
    """            {{- '}\\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\\n' }}""",
    """            {{- '}\\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\\n' }}
        {%- endgeneration %}""",
)

FAMILIES = {
    "llama3.1": {
        "template": LLAMA31,
        "marked": LLAMA31_MARKED,
        "bos": "<|begin_of_text|>",
        "eos": "<|eot_id|>",
        "pad": "<|end_of_text|>",
    },
    "qwen2.5": {"template": QWEN25, "marked": QWEN25_MARKED, "bos": None, "eos": "<|im_end|>", "pad": "<|endoftext|>"},
}
SPECIALS = [
    "<|begin_of_text|>",
    "<|end_of_text|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eot_id|>",
    "<|eom_id|>",
    "<|python_tag|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|endoftext|>",
]
CORPUS = (
    "You are Qwen, created by Alibaba Cloud. You are a helpful assistant. Cutting Knowledge Date: December 2023 "
    "Today Date: 26 Jul 2024 Environment: ipython system user assistant tool ipython tool_call tool_response "
    "name arguments parameters function weather city Paris the in is what sunny degrees please reverse cat dog "
    '{"name": "get_weather", "arguments": {"city": "Paris"}} hello there how can help you today'
)


def family_tokenizer(path: Path, family: str, *, marked: bool) -> Path:
    """A byte-level BPE tokenizer (as Llama 3 and Qwen2 use; every byte has a token, so every character
    of a rendering is covered) with the family's special tokens and chat template, saved to ``path``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    spec = FAMILIES[family]
    raw = Tokenizer(models.BPE())
    raw.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    raw.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400, special_tokens=SPECIALS, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    raw.train_from_iterator([CORPUS] * 10, trainer)
    if spec["bos"]:  # Llama 3's tokenizer puts BOS before plain text
        raw.post_processor = processors.TemplateProcessing(
            single=f"{spec['bos']} $A", special_tokens=[(spec["bos"], raw.token_to_id(spec["bos"]))]
        )
    tok = PreTrainedTokenizerFast(
        tokenizer_object=raw, bos_token=spec["bos"], eos_token=spec["eos"], pad_token=spec["pad"]
    )
    tok.chat_template = spec["marked" if marked else "template"]
    tok.save_pretrained(path)
    return Path(path)


WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "the weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}


def conversations(family: str) -> dict[str, dict]:
    """Records in the messages format, as teams hold them (OpenAI's tool calls with string arguments and
    null content), each with the messages a chat template is given after the data step reads them."""
    call = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
    parsed = {**call, "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}
    result = "ipython" if family == "llama3.1" else "tool"
    cases = {
        "plain": [
            {"role": "user", "content": "what is the weather in Paris"},
            {"role": "assistant", "content": "sunny"},
        ],
        "system and two turns": [
            {"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": "please reverse cat dog"},
            {"role": "assistant", "content": "dog cat"},
            {"role": "user", "content": "how can you help"},
            {"role": "assistant", "content": "hello there"},
        ],
        "assistant first": [
            {"role": "assistant", "content": "hello there how can help you today"},
            {"role": "user", "content": "please reverse cat dog"},
            {"role": "assistant", "content": "dog cat"},
        ],
        "tool call": [
            {"role": "user", "content": "what is the weather in Paris"},
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": result, "tool_call_id": "call_1", "content": "sunny 21 degrees"},
            {"role": "assistant", "content": "sunny"},
        ],
        "text parts": [
            {
                "role": "user",
                "content": [{"type": "text", "text": "what is "}, {"type": "text", "text": "the weather"}],
            },
            {"role": "assistant", "content": [{"type": "text", "text": "sunny"}]},
        ],
    }
    given = {
        "plain": cases["plain"],
        "system and two turns": cases["system and two turns"],
        "assistant first": cases["assistant first"],
        "tool call": [
            cases["tool call"][0],
            {"role": "assistant", "content": "", "tool_calls": [parsed]},
            *cases["tool call"][2:],
        ],
        "text parts": [
            {"role": "user", "content": "what is the weather"},
            {"role": "assistant", "content": "sunny"},
        ],
    }
    if family == "qwen2.5":  # Llama 3.1's template takes one call a turn and renders no text beside it
        two = {**call, "id": "call_2", "function": {"name": "get_weather", "arguments": '{"city": "Rome"}'}}
        cases["text and two calls"] = [
            {"role": "user", "content": "what is the weather in Paris and Rome"},
            {"role": "assistant", "content": "let me check", "tool_calls": [call, two]},
            {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
            {"role": "tool", "tool_call_id": "call_2", "content": "cloudy"},
            {"role": "assistant", "content": "sunny in Paris"},
        ]
        given["text and two calls"] = [
            cases["text and two calls"][0],
            {
                "role": "assistant",
                "content": "let me check",
                "tool_calls": [parsed, {**two, "function": {"name": "get_weather", "arguments": {"city": "Rome"}}}],
            },
            *cases["text and two calls"][2:],
        ]
    records = {name: {"record": {"messages": messages}, "messages": given[name]} for name, messages in cases.items()}
    records["tool call"]["record"]["tools"] = [WEATHER_TOOL]
    records["tool call"]["tools"] = [WEATHER_TOOL]
    if "text and two calls" in records:
        records["text and two calls"]["record"]["tools"] = json.dumps([WEATHER_TOOL])  # tools as a JSON string
        records["text and two calls"]["tools"] = [WEATHER_TOOL]
    return records
