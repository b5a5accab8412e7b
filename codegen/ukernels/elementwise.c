/* Micro-kernels for the elementwise family. See kiln_uk.h for the contract. */
#include "kiln_uk.h"
