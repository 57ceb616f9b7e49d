"""Generated SkyWalking v3 protocol modules: do not edit; run scripts/gen_protos.sh."""
