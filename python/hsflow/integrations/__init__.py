# SPDX-License-Identifier: Apache-2.0
"""Adapters from hsflow's batches to the trainers teams use.

hsflow.integrations.speculators: speculators' EAGLE-3 and DFlash drafters
(pip install 'hsflow[speculators]').
"""
