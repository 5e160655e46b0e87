/* The example plugin's one knob: the L2 weight decay of its three weight matrices (the biases are
 * not decayed). Build with -DMLP2_WEIGHT_DECAY=... to change its default, or set it per run with
 * the program's own settings, --program-config '{"weight_decay": 0.01}' (0 turns it off). */
#ifndef MLP2_H
#define MLP2_H

#ifndef MLP2_WEIGHT_DECAY
#define MLP2_WEIGHT_DECAY 1e-3f
#endif

#endif
