/* Micro-kernels for the reduce family. See kiln_uk.h for the contract. */
#include "kiln_uk.h"
