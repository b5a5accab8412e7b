/* Micro-kernels for the movement family. See kiln_uk.h for the contract. */
#include "kiln_uk.h"
