"""`linvit export`: a finished run's model as a Hugging Face Hub-style folder in timm's conventions
(model.safetensors, config.json, a model card from the run's own records), optionally pushed to
the Hub."""
