"""The plugin API's services: what a plugin calls to do its work, beside the contracts of :mod:`populora_core.api`.

The second floor of the core (``api`` < ``services`` < ``plugin`` < ``recipe`` < ``run`` < ``cli``): its modules
import the api floor and each other, and torch, transformers, peft and safetensors only inside functions. The shared
base model (:mod:`.modelhost`), PEFT adapter directories (:mod:`.adapters`), a model's shape from its config
(:mod:`.architecture`), the visible GPU (:mod:`.gpu`), torch's threads and the runtime settings (:mod:`.runtime`),
installed versions (:mod:`.installed`), trainer state files (:mod:`.trainer_state`), atomic writes (:mod:`.files`),
problem files (:mod:`.problems`), spreading a call's items (:mod:`.batching`), making a child (:mod:`.operators`),
the probe (:mod:`.probe`) and paired statistics (:mod:`.statistics`). The loop uses them too; plugins may import
every module here (:data:`populora_core.PUBLIC_MODULES`).
"""
