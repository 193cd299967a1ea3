"""ms-swift ``--external_plugins`` file of gdpo-spec: the ``grpo`` trainer becomes
impl.integrations.swift.GDPOGRPOTrainer (impl.gdpo's advantages under ``--scale_rewards gdpo``).

    swift rlhf --rlhf_type grpo --scale_rewards gdpo ... --external_plugins "$(python3 -m impl.integrations.swift)"
"""
from impl.integrations.swift import register

register()
