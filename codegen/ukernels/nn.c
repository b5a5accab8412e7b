/* Micro-kernels for the nn family. See kiln_uk.h for the contract. */
#include "kiln_uk.h"
