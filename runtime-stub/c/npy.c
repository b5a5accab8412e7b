/* .npy reading and writing for the executable entry. */
#include "kiln_rt.h"
