"""A Tinker client's tokenizers, as the official SDK gets them: `python tokenizer_probe.py URL KEY BASE_MODEL TEXT`.

Run in a process of its own (another machine's environment: HF_HUB_CACHE, HF_HUB_OFFLINE=1, a scratch cwd, or
another network namespace; read as source, so it needs only the `tinker` SDK and transformers). It makes a training
client of BASE_MODEL, saves its weights for a sampler by name and makes a sampling client from that checkpoint path,
then loads the tokenizer from each with the SDK's own `get_tokenizer()`. Prints one JSON line: per client the name
the tokenizer was loaded by and TEXT's ids; the names the server gave (get_info, the sampler's base model).
"""

import json
import sys

import tinker

url, key, base_model, text = sys.argv[1:5]
service = tinker.ServiceClient(base_url=url, api_key=key)
try:
    training = service.create_lora_training_client(base_model=base_model, rank=8, seed=0).result()
    path = training.save_weights_for_sampler("tokenizer-probe").result().path
    sampler = service.create_sampling_client(model_path=path).result()
    out = {"info": training.get_info().model_data.model_dump(), "sampler_base_model": sampler.get_base_model()}
    for name, client in (("training", training), ("sampler", sampler)):
        tokenizer = client.get_tokenizer()
        out[name] = {"name_or_path": tokenizer.name_or_path, "ids": tokenizer.encode(text, add_special_tokens=False),
                     "eos": tokenizer.eos_token}
    print(json.dumps(out))
finally:
    service.close("success").result(timeout=30)
