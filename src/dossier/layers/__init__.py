"""The layers of the retrieve call, one module each; ``dossier.retrieve.PIPELINE`` runs them in order."""
